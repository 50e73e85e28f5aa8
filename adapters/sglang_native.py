"""SGLang's native `POST /generate` wire format, translated to and from OpenAI's.

Request: `{"input_ids": [...], "sampling_params": {...}, "stream": bool, "rid": ..., "extra_key": salt}`.
Answer: `{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
"completion_tokens", "cached_tokens", ...}}`; streamed as SSE of such objects whose `text` is the
whole text so far, ended by `data: [DONE]`. `finish_reason` is an object: `{"type": "length",
"length": n}`, `{"type": "stop", "matched": ...}` or `{"type": "abort", "message", "status_code"}`;
an abort becomes an error (a 503 abort is retryable), never an empty success. A stream may also
carry `data: {"error": {...}}` for failures after headers were sent.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from adapters.base import Completion, EngineRequest
from adapters.errors import EngineError, EngineOverloaded, InBandError, UpstreamStatusError
from adapters.schema import ChatCompletionRequest, ErrorProbe, PassThroughRequest, PromptTokensDetails, Usage

_PLAIN_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop_token_ids",
    "seed",
)


class _Finish(msgspec.Struct, kw_only=True):
    type: str = "stop"
    message: str | None = None
    status_code: int | None = None


class _Meta(msgspec.Struct, kw_only=True):
    id: str | None = None
    finish_reason: _Finish | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None


class _Generated(msgspec.Struct, kw_only=True):
    text: str = ""
    meta_info: _Meta = msgspec.field(default_factory=_Meta)
    error: ErrorProbe | str | None = None


_decoder = msgspec.json.Decoder(_Generated)


@dataclass(slots=True)
class NativeRequest:
    """One request on `/generate`, and the OpenAI shape its answer must take."""

    chat: bool
    model: str
    include_usage: bool
    response_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    _sent: str = ""

    def completion(self, body: bytes) -> Completion:
        """A whole `/generate` answer as an OpenAI (chat) completion body."""
        answer = _decode(body)
        finish = _finish_reason(answer.meta_info.finish_reason)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": answer.text}
        else:
            choice["text"] = answer.text
        usage = _usage(answer.meta_info)
        payload = {**self._envelope(final=True), "choices": [choice], "usage": usage}
        return Completion(
            body=msgspec.json.encode(payload),
            usage=usage,
            response_id=self.response_id,
            response_model=self.model,
            finish_reasons=[finish] if finish else [],
            choices=1,
        )

    def stream_chunks(self, data: bytes) -> list[bytes]:
        """OpenAI chunks for one `/generate` event: the text delta, then the usage chunk at the end."""
        answer = _decode(data)
        text = answer.text
        # Cumulative text extends what was sent; with incremental streaming each event is new text.
        delta = text[len(self._sent) :] if text.startswith(self._sent) else text
        self._sent = text if text.startswith(self._sent) else self._sent + text
        finish = _finish_reason(answer.meta_info.finish_reason)
        chunks: list[bytes] = []
        if delta or finish:
            piece: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if self.chat:
                piece["delta"] = {"role": "assistant", "content": delta}
            else:
                piece["text"] = delta
            chunks.append(msgspec.json.encode({**self._envelope(final=False), "choices": [piece]}))
        if finish and self.include_usage:
            usage = _usage(answer.meta_info)
            chunks.append(msgspec.json.encode({**self._envelope(final=False), "choices": [], "usage": usage}))
        return chunks

    def _envelope(self, *, final: bool) -> dict[str, Any]:
        kind = "text_completion"
        if self.chat:
            kind = "chat.completion" if final else "chat.completion.chunk"
        return {"id": self.response_id, "object": kind, "created": self.created, "model": self.model}


def native_request(request: EngineRequest) -> NativeRequest | None:
    """A `NativeRequest` when `/generate` can serve `request` exactly; None when it needs the OpenAI API
    (several choices, tools, response formats, logprobs, echo or suffix)."""
    params = request.params
    if isinstance(params, PassThroughRequest) or params.n != 1 or params.logit_bias:
        return None
    if isinstance(params, ChatCompletionRequest):
        if params.tools or params.response_format or params.logprobs:
            return None
    elif params.logprobs is not None or params.echo or params.suffix is not None:
        return None
    chat = isinstance(params, ChatCompletionRequest)
    include_usage = params.stream_options is not None and params.stream_options.include_usage
    prefix = "chatcmpl" if chat else "cmpl"
    return NativeRequest(
        chat=chat,
        model=params.model,
        include_usage=include_usage,
        response_id=f"{prefix}-{request.request_id or uuid.uuid4().hex}",
    )


def generate_body(request: EngineRequest, native: NativeRequest, *, stream: bool = False) -> bytes:
    """The `/generate` request body."""
    params = request.params
    sampling: dict[str, Any] = {}
    limit = params.token_limit
    if limit is not None:
        sampling["max_new_tokens"] = limit
    for name in _PLAIN_SAMPLING:
        value = getattr(params, name)
        if value is not None:
            sampling["sampling_seed" if name == "seed" else name] = value
    if params.stop is not None:
        sampling["stop"] = params.stop
    body: dict[str, Any] = {
        "input_ids": request.prompt_token_ids,
        "sampling_params": sampling,
        "stream": stream,
    }
    if request.request_id:
        body["rid"] = request.request_id
    if request.cache_salt:
        body["extra_key"] = request.cache_salt
    return msgspec.json.encode(body)


def _decode(data: bytes) -> _Generated:
    try:
        answer = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise EngineError(f"SGLang /generate answered with invalid JSON: {data[:200]!r}") from exc
    if answer.error is not None:
        if isinstance(answer.error, str):
            raise InBandError(answer.error)
        raise InBandError(answer.error.message or "SGLang reported an error", param=answer.error.param)
    return answer


def _finish_reason(finish: _Finish | None) -> str | None:
    if finish is None:
        return None
    if finish.type == "abort":
        message = finish.message or "SGLang aborted the request"
        if finish.status_code == 503:
            raise EngineOverloaded(message)
        if finish.status_code is not None and finish.status_code >= 400:
            raise UpstreamStatusError(finish.status_code, message)
        raise InBandError(message)
    return "length" if finish.type == "length" else "stop"


def _usage(meta: _Meta) -> Usage:
    details = (
        PromptTokensDetails(cached_tokens=meta.cached_tokens) if meta.cached_tokens is not None else None
    )
    return Usage(
        prompt_tokens=meta.prompt_tokens,
        completion_tokens=meta.completion_tokens,
        total_tokens=meta.prompt_tokens + meta.completion_tokens,
        prompt_tokens_details=details,
    )
