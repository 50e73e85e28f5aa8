"""The carry policy on SmolLM2's own chat template: the spans a windowed chat keeps whole."""

from __future__ import annotations

from adapters.local.carry import carry_spans
from adapters.local.loader import LoadedModel
from adapters.schema import ChatMessage

SYSTEM = "You are a harbour clerk who answers in one sentence."
QUESTION = "Which building did the ships pass at dawn?"


def test_the_system_prompt_and_the_latest_user_turn_are_found(loaded: LoadedModel) -> None:
    messages = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", content="Ship one passed the lighthouse. " * 40),
        ChatMessage(role="assistant", content="Noted."),
        ChatMessage(role="user", content=QUESTION),
    ]
    prompt = loaded.tokenizer.encode(loaded.template.render(messages))
    carry = carry_spans(messages, prompt, loaded.tokenizer, loaded.template, window_size=1024)
    assert SYSTEM in loaded.tokenizer.decode(prompt[: carry.head])
    assert "Ship" not in loaded.tokenizer.decode(prompt[: carry.head])
    turn = loaded.tokenizer.decode(prompt[carry.pin_start : carry.pin_end])
    assert QUESTION in turn and "Noted" not in turn


def test_spans_longer_than_half_the_window_slide_like_any_text(loaded: LoadedModel) -> None:
    messages = [
        ChatMessage(role="system", content="Remember every ship. " * 60),
        ChatMessage(role="user", content="Ship two passed the pier. " * 60),
    ]
    prompt = loaded.tokenizer.encode(loaded.template.render(messages))
    carry = carry_spans(messages, prompt, loaded.tokenizer, loaded.template, window_size=256)
    assert carry.head == 0 and carry.pin_end == carry.pin_start == 0
