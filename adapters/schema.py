"""The OpenAI wire format that the proxy and every adapter share.

Request Structs decode only the fields radixgate reads; every other field stays in the
raw body and reaches OpenAI-compatible upstreams unchanged. Small "probe" Structs read
the few response fields the gateway needs (ids, finish reasons, usage) from any body.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Operation = Literal["chat", "text_completion", "embeddings", "responses"]
"""`gen_ai.operation.name` of the endpoints the pipeline serves."""
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
"""The chat roles of the OpenAI API; any other is a 400 naming `messages[i].role`."""

MAX_CHOICES = 128
"""Largest `n` accepted (OpenAI's own bound)."""
MAX_MESSAGES = 4096
"""Most messages one chat request may carry."""
MAX_TOP_LOGPROBS = 20
TokenCount = Annotated[int, msgspec.Meta(ge=1)]


class StreamOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    include_usage: bool = False


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One chat message. `content` is a string or a list of content parts."""

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class SamplingFields(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Fields common to chat and text completions."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_CHOICES)] = 1
    max_tokens: TokenCount | None = None
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
    use_beam_search: bool = False
    """vLLM's beam search: `n` beams, the choices ranked best first."""
    length_penalty: float | None = None
    early_stopping: bool | None = None
    # Cache salts are the gateway's to set. Decoding them here catches a client's value however its
    # key is spelled in JSON (`"cache\\u005fsalt"`), so the proxy can drop it (`has_client_salt`).
    cache_salt: Any = msgspec.UNSET
    extra_key: Any = msgspec.UNSET
    """SGLang's name for the salt (native `/generate`)."""

    @property
    def has_client_salt(self) -> bool:
        """True when the client sent a salt field of its own (to be dropped, never forwarded)."""
        return self.cache_salt is not msgspec.UNSET or self.extra_key is not msgspec.UNSET


class ChatCompletionRequest(SamplingFields, kw_only=True, omit_defaults=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    @property
    def token_limit(self) -> int | None:
        """`max_completion_tokens` wins over the deprecated `max_tokens`."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields, kw_only=True, omit_defaults=True):
    prompt: str | list[str | int | list[int]]
    """A string, a list of strings, a list of token ids, or a list of token-id lists. (msgspec
    allows one array type per union, so the list's item type is the union.)"""
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool = False
    suffix: str | None = None

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens


class PassThroughRequest(SamplingFields, kw_only=True, omit_defaults=True):
    """A request whose body reaches the worker's endpoint of the same name, with no prompt the gateway
    reads (no routing tokens): embeddings, and Responses for a worker that serves them (salted by the
    engines that take a salt there, like chat).
    It shares the sampling fields' Struct so the request path reads every request alike."""

    @property
    def token_limit(self) -> int | None:
        return None


class EmbeddingRequest(PassThroughRequest, kw_only=True, omit_defaults=True):
    """`POST /v1/embeddings`; one that asks to stream is refused by the pipeline."""

    input: str | list[str | int | list[int]]
    """A string, strings, token ids, or lists of token ids, as for completions' `prompt`."""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: TokenCount | None = None


class NativeResponsesRequest(PassThroughRequest, kw_only=True, omit_defaults=True):
    """`POST /v1/responses` for a worker that serves it (validated by `proxy.responses` first)."""

    max_output_tokens: TokenCount | None = None

    @property
    def token_limit(self) -> int | None:
        return self.max_output_tokens


GenerationRequest = ChatCompletionRequest | CompletionRequest
RequestParams = GenerationRequest | PassThroughRequest
"""What the pipeline decodes of any request it serves."""


# ---- responses -------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct, kw_only=True, omit_defaults=True):
    cached_tokens: int | None = None


class CompletionTokensDetails(msgspec.Struct, kw_only=True, omit_defaults=True):
    accepted_prediction_tokens: int | None = None
    """Predicted (speculative draft) tokens that appeared in the answer."""
    rejected_prediction_tokens: int | None = None


class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None

    @property
    def accepted_prediction_tokens(self) -> int:
        """Speculative draft tokens the engine accepted for this answer (0 when it did not say)."""
        details = self.completion_tokens_details
        return (details.accepted_prediction_tokens or 0) if details is not None else 0

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
