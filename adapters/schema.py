"""The OpenAI wire format that the proxy and every adapter share.

Request Structs decode only the fields radixgate reads; every other field stays in the
raw body and reaches OpenAI-compatible upstreams unchanged. Small "probe" Structs read
the few response fields the gateway needs (ids, finish reasons, usage) from any body.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Operation = Literal["chat", "text_completion"]
"""`gen_ai.operation.name` of the two generation endpoints."""


class StreamOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    include_usage: bool = False


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One chat message. `content` is a string or a list of content parts."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class SamplingFields(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Fields common to chat and text completions."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions that vLLM and SGLang accept on their OpenAI endpoints.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True, omit_defaults=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    @property
    def token_limit(self) -> int | None:
        """`max_completion_tokens` wins over the deprecated `max_tokens`."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields, kw_only=True, omit_defaults=True):
    prompt: str | list[str | int | list[int]]
    """A string, a list of strings, a list of token ids, or a list of token-id lists. (msgspec
    allows one array type per union, so the list's item type is the union.)"""
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens


GenerationRequest = ChatCompletionRequest | CompletionRequest


# ---- responses -------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct, kw_only=True, omit_defaults=True):
    cached_tokens: int | None = None


class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens the engine served from its prefix cache; None when it did not say."""
        return self.prompt_tokens_details.cached_tokens if self.prompt_tokens_details else None


class DeltaProbe(msgspec.Struct, kw_only=True):
    """What a chat stream chunk's `delta` carries; tool calls are left undecoded."""

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: msgspec.Raw | None = None


class ChoiceProbe(msgspec.Struct, kw_only=True):
    index: int = 0
    finish_reason: str | None = None
    delta: DeltaProbe | None = None
    text: str | None = None
    """A completions (not chat) chunk's text."""

    @property
    def carries_token(self) -> bool:
        """True when the choice holds generated output: text, content, reasoning or a tool call
        (not the empty role chunk a chat stream opens with)."""
        if self.text:
            return True
        delta = self.delta
        return delta is not None and bool(delta.content or delta.reasoning_content or delta.tool_calls)


class ErrorProbe(msgspec.Struct, kw_only=True):
    message: str = ""
    type: str | None = None
    param: str | None = None
    code: str | int | None = None


class ResponseProbe(msgspec.Struct, kw_only=True):
    """The fields the gateway reads from a response body or a stream chunk."""

    id: str | None = None
    model: str | None = None
    choices: list[ChoiceProbe] = msgspec.field(default_factory=list)
    usage: Usage | None = None
    error: ErrorProbe | None = None


def probe_response(payload: bytes) -> ResponseProbe:
    """Read ids, finish reasons, usage or an in-band error from one JSON payload."""
    return _probe_decoder.decode(payload)


_probe_decoder = msgspec.json.Decoder(ResponseProbe)
