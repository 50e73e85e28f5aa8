"""Our tokenizer and chat template against `transformers` loading the same GGUF."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.errors import InvalidRequest
from adapters.local.loader import LoadedModel
from adapters.schema import ChatMessage

CORPUS = [
    "Hello world",
    "The year 2024 had 366 days; 3.14159 is pi. Call 555-1234 or +44 20 7946 0958!",
    " leading space",
    "  two  spaces\t\ttabs\n\n\nnewlines   trailing   ",
    "naïve café — déjà vu, Ünïcödé, Ελληνικά, русский",
    "日本語のテキストです。中文也可以。한국어 텍스트",
    "emoji 😀🎉👩‍👩‍👧‍👦 🇫🇷 🦜 done",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "if (a && b) { return c->d[i++]; } // C\r\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "mixed123abc 0x1F 1,000,000.50 1e-9",
    "I'm you're we'll they'd it's",
    "\u200b zero width \u00a0 nbsp",
    "ñ" * 40,
    "a" * 300,
    "                                                                  deep indent",
    "",
]


@pytest.mark.parametrize("text", CORPUS)
def test_token_ids_equal_the_reference(loaded: LoadedModel, hf_tokenizer: Any, text: str) -> None:
    ours = loaded.tokenizer.encode(text)
    assert ours == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert loaded.tokenizer.decode(ours) == hf_tokenizer.decode(ours, skip_special_tokens=True)


def test_chat_template_renders_like_transformers(loaded: LoadedModel, hf_tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Hi! 👋"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    ours = loaded.template.render([ChatMessage(**m) for m in messages])
    assert ours == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_text_content_parts_are_joined(loaded: LoadedModel) -> None:
    parts = ChatMessage(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert loaded.template.render([parts]) == loaded.template.render([ChatMessage(role="user", content="ab")])


def test_image_parts_are_refused(loaded: LoadedModel) -> None:
    image = ChatMessage(role="user", content=[{"type": "image_url", "image_url": {"url": "x"}}])
    with pytest.raises(InvalidRequest, match="image_url"):
        loaded.template.render([image])
