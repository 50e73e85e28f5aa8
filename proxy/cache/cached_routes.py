"""`POST /v1/cached/chat/completions` and `POST /v1/cached/completions` (the seed's cached endpoints).

A cached endpoint is the plain OpenAI route with the seed's extras:

- request extras, removed before the body goes upstream: `enable_caching` (false: bypass the
  response cache), `cache_key` (a label: opts a sampled request into the response cache and
  partitions entries), `request_id` (becomes the request's `x-request-id`), `enable_speculation`
  (speculative decoding for this request in the embedded engine; left out: the engine's default;
  other engines ignore it; when true, the `[speculative]` section's `temperature`, `top_k` and
  `top_p` fill in whichever of them the request leaves out, as the seed's speculative sampling
  settings) and `enable_sliding_window` (the embedded engine attends with its sliding window, or
  not; absent: the `[sliding_window] enabled` default);
- response extras: `usage.cached_tokens`, `cache_stats`, `performance`, `request_id`. A JSON answer
  carries them at the top level; a stream gets one extra chunk with no choices just before `[DONE]`.

The request runs through the same pipeline as the plain routes (auth, routing, the response-cache
step, retries), with the extras passed as explicit options (`CachedCall`); this module only rewrites
the body on the way in and decorates the answer on the way out.

Meanings (the seed leaves them open): `usage.cached_tokens` is the prompt tokens not computed for
this answer (all of them on a response-cache hit, else the engine's reported prefix-cache tokens);
`cache_stats.cache_hits`/`cache_misses`/`hit_rate` are the caller's tenant's response-cache counters;
`prefix_matches` is 1 when the engine reused a cached prefix for this request; `speculation_hits`
is the draft tokens the engine accepted for it (its
`usage.completion_tokens_details.accepted_prediction_tokens`; 0 on a response-cache hit);
`window_reuse` is 1 when the request asked for the sliding window (`enable_sliding_window: true`)
and its kept cache started from cached pages. `performance.cache_time_ms` is the lookup (and on a
hit the replay), `inference_time_ms` the engine's part, `memory_usage_bytes` the size of this
answer's response-cache entry (0 when bypassed), `tokens_per_second` completion tokens per second
of `total_time_ms` (null when the answer reports no usage).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
from litestar.handlers import ASGIRouteHandler, asgi

from adapters.schema import Operation
from proxy.asgi_types import Receive, Scope, Send
from proxy.cache.config import SpeculativeConfig
from proxy.cache.decorate import AnswerDecorator
from proxy.cache.step import CachedCall
from proxy.errors import ApiError, split_validation_error
from proxy.pipeline import MAX_CLIENT_REQUEST_ID, GenerationCall, Pipeline
from proxy.routes.generation import ClientDisconnected, answer, read_request

CACHED_CHAT_PATH = "/v1/cached/chat/completions"
CACHED_COMPLETIONS_PATH = "/v1/cached/completions"
MAX_CACHE_KEY = 256
"""Longest `cache_key` accepted."""
PRINTABLE_ASCII = r"^[\x20-\x7e]+$"
"""What a `request_id` may hold (it becomes the `x-request-id` header)."""

_object_decoder = msgspec.json.Decoder(dict[str, Any])


class CacheExtras(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The seed's request extras."""

    enable_caching: bool = True
    enable_speculation: bool | None = None
    enable_sliding_window: bool | None = None
    cache_key: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CACHE_KEY)] | None = None
    request_id: (
        Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CLIENT_REQUEST_ID, pattern=PRINTABLE_ASCII)]
        | None
    ) = None


EXTRA_FIELDS = frozenset(CacheExtras.__struct_fields__)


def cached_handlers(
    pipeline: Pipeline, max_body_bytes: int, speculative: SpeculativeConfig
) -> list[ASGIRouteHandler]:
    """The two cached generation routes over one pipeline; `speculative` gives the sampling
    settings a request with `enable_speculation: true` leaves out."""
    sampling = {
        "temperature": speculative.temperature,
        "top_k": speculative.top_k,
        "top_p": speculative.top_p,
    }

    async def handle(operation: Operation, scope: Scope, receive: Receive, send: Send) -> None:
        """Strip the extras, run the pipeline with them as explicit options, decorate its answer."""
        started = time.perf_counter()
        try:
            request = await read_request(pipeline, scope, receive, max_body_bytes)
        except ClientDisconnected:
            return
        extras, body = split_extras(request.body, sampling)
        request_id = extras.request_id.encode() if extras.request_id is not None else request.request_id
        cached = CachedCall(
            enable_caching=extras.enable_caching,
            label=extras.cache_key,
            speculation=extras.enable_speculation,
            sliding_window=extras.enable_sliding_window,
        )
        call = GenerationCall(operation, body, request.tenant, request_id, request.cache_control, cached)
        await answer(
            pipeline,
            call,
            receive,
            send,
            wrap=lambda responder: AnswerDecorator(responder, cached, started, extras.request_id),
        )

    @asgi(CACHED_CHAT_PATH, name="cached_chat_completions", copy_scope=False)
    async def cached_chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
        await handle("chat", scope, receive, send)

    @asgi(CACHED_COMPLETIONS_PATH, name="cached_completions", copy_scope=False)
    async def cached_completions(scope: Scope, receive: Receive, send: Send) -> None:
        await handle("text_completion", scope, receive, send)

    return [cached_chat_completions, cached_completions]


def split_extras(body: bytes, sampling: dict[str, float] | None = None) -> tuple[CacheExtras, bytes]:
    """The extras and the body without them; with `enable_speculation: true`, `sampling`'s
    values for the keys the body leaves out are added. A body that is not a JSON object is
    returned unchanged (the generation handler then answers the right error)."""
    try:
        fields = _object_decoder.decode(body)
    except msgspec.DecodeError:
        return CacheExtras(), body
    present = {name: fields.pop(name) for name in EXTRA_FIELDS if name in fields}
    try:
        extras = msgspec.convert(present, CacheExtras)
    except msgspec.ValidationError as exc:
        message, param = split_validation_error(str(exc))
        raise ApiError(400, f"Invalid request: {message}", param=param, code="invalid_value") from None
    if extras.enable_speculation and sampling:
        missing = {key: value for key, value in sampling.items() if key not in fields}
        fields.update(missing)
        present.update(missing)
    return extras, (msgspec.json.encode(fields) if present else body)
