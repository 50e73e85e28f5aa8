"""Request validation: every bad value is a 400 naming the parameter."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.errors import InvalidRequest
from adapters.local.loader import LoadedModel
from adapters.local.prepare import EngineLimits, prepare
from adapters.schema import ChatCompletionRequest, ChatMessage, CompletionRequest

LIMITS = EngineLimits(vocab_size=49152, max_context=256, pool_tokens=1024, page_size=16, max_n=4)


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[ChatMessage(role="user", content="hi")], **fields)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": 1.2}, "min_p"),
        ({"top_k": -2}, "top_k"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"n": 0}, "n"),
        ({"n": 5}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 10_000}, "max_tokens"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stop_token_ids": [49152]}, "stop_token_ids"),
        ({"logit_bias": {"abc": 1.0}}, "logit_bias"),
        ({"logit_bias": {"5": 101.0}}, "logit_bias"),
        ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_chat_values_are_400(loaded: LoadedModel, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        prepare(chat(**fields), loaded.tokenizer, loaded.template, LIMITS)
    assert raised.value.status == 400 and raised.value.param == param


def test_a_prompt_longer_than_the_context_is_refused(loaded: LoadedModel) -> None:
    long = ChatCompletionRequest(model="m", messages=[ChatMessage(role="user", content="word " * 400)])
    with pytest.raises(InvalidRequest) as raised:
        prepare(long, loaded.tokenizer, loaded.template, LIMITS)
    assert raised.value.code == "context_length_exceeded"


def test_defaults_fill_the_remaining_context(loaded: LoadedModel) -> None:
    prepared = prepare(chat(), loaded.tokenizer, loaded.template, LIMITS)
    assert prepared.params.max_tokens == LIMITS.max_context - prepared.prompt_tokens
    assert prepared.params.temperature == 1.0 and not prepared.params.greedy


def test_completion_prompt_forms(loaded: LoadedModel) -> None:
    single = prepare(CompletionRequest(model="m", prompt="hello"), loaded.tokenizer, loaded.template, LIMITS)
    ids = prepare(CompletionRequest(model="m", prompt=[1, 2, 3]), loaded.tokenizer, loaded.template, LIMITS)
    many = prepare(
        CompletionRequest(model="m", prompt=["a", "b"], n=2), loaded.tokenizer, loaded.template, LIMITS
    )
    assert single.groups[0].prompt == loaded.tokenizer.encode("hello")
    assert ids.groups[0].prompt == [1, 2, 3]
    assert [(g.first_index, g.n) for g in many.groups] == [(0, 2), (2, 2)]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": [60000]}, "prompt"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ],
)
def test_bad_completion_values_are_400(loaded: LoadedModel, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        prepare(CompletionRequest(model="m", **fields), loaded.tokenizer, loaded.template, LIMITS)
    assert raised.value.param == param
