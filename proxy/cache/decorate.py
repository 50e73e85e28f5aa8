"""Adds the seed's response extras (`usage.cached_tokens`, `cache_stats`, `performance`, `request_id`)
to an answer of a cached endpoint as it passes through ASGI `send`.

Errors (any status but 200) pass unchanged. A JSON answer is held until its last byte, extended and
sent with a new `content-length`. A stream passes chunk by chunk; one extra chunk with no choices
(the shape of OpenAI's usage chunk) carrying the extras goes out just before `[DONE]`, unless the
stream ended with an error event.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from adapters.schema import Usage
from adapters.sse import DONE, SSEDecoder
from proxy.asgi_types import Message, Send
from proxy.cache.radix_stats import percent
from proxy.cache.step import CachedCall
from proxy.routes.generation import REQUEST_ID_HEADER
from proxy.streaming import DONE_EVENT, sse_event


class CacheStatsExtra(msgspec.Struct, kw_only=True):
    """`cache_stats` of one answer (see `proxy.cache.cached_routes` for the meanings)."""

    cache_used: bool
    hit_rate: float
    cache_hits: int
    cache_misses: int
    speculation_hits: int = 0
    prefix_matches: int
    window_reuse: int = 0


class PerformanceExtra(msgspec.Struct, kw_only=True):
    """`performance` of one answer, measured in the gateway."""

    total_time_ms: float
    cache_time_ms: float
    inference_time_ms: float
    tokens_per_second: float | None
    memory_usage_bytes: int


class _Head(msgspec.Struct, kw_only=True):
    """The fields of a body or chunk the extras need."""

    id: str | None = None
    object: str | None = None
    created: int | None = None
    model: str | None = None
    usage: Usage | None = None
    error: Any = None


_head_decoder = msgspec.json.Decoder(_Head)
_object_decoder = msgspec.json.Decoder(dict[str, Any])


class AnswerDecorator:
    """Wraps the client's `send` for one cached-endpoint request."""

    __slots__ = (
        "_answer_bytes",
        "_call",
        "_decoder",
        "_errored",
        "_first",
        "_held",
        "_mode",
        "_next",
        "_parts",
        "_request_id",
        "_started",
        "_usage",
    )

    def __init__(self, send: Send, call: CachedCall, started: float, request_id: str | None) -> None:
        self._next = send
        self._call = call
        self._started = started
        self._request_id = request_id
        self._mode = "pass"
        self._held: Message | None = None
        self._parts: list[bytes] = []
        self._decoder = SSEDecoder()
        self._first: _Head | None = None
        self._usage: Usage | None = None
        self._answer_bytes = 0
        self._errored = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            await self._start(message)
        elif message["type"] == "http.response.body" and self._mode == "json":
            await self._json_body(message)
        elif message["type"] == "http.response.body" and self._mode == "sse":
            await self._sse_body(message)
        else:
            await self._next(message)

    async def _start(self, message: Message) -> None:
        headers: list[tuple[bytes, bytes]] = message["headers"]
        for name, value in headers:
            if name == REQUEST_ID_HEADER and self._request_id is None:
                self._request_id = value.decode("latin-1")
            elif name == b"content-type" and message["status"] == 200:
                self._mode = "sse" if value.startswith(b"text/event-stream") else "json"
        if self._mode == "json":
            self._held = message
            return
        await self._next(message)

    async def _json_body(self, message: Message) -> None:
        self._parts.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(self._parts)
        try:
            fields = _object_decoder.decode(body)
            head = _head_decoder.decode(body)
        except msgspec.DecodeError:
            fields = None
        if fields is not None:
            self._usage, self._answer_bytes = head.usage, len(body)
            cache_stats, performance, cached_tokens = self._extras()
            usage = fields.get("usage")
            if isinstance(usage, dict):  # one figure in both places (a hit: every prompt token)
                usage["cached_tokens"] = cached_tokens
                details = usage.get("prompt_tokens_details")
                usage["prompt_tokens_details"] = {
                    **(details if isinstance(details, dict) else {}),
                    "cached_tokens": cached_tokens,
                }
            fields.update(cache_stats=cache_stats, performance=performance, request_id=self._request_id)
            body = msgspec.json.encode(fields)
        assert self._held is not None
        headers = [(n, v) for n, v in self._held["headers"] if n != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._next({**self._held, "headers": headers})
        await self._next({"type": "http.response.body", "body": body, "more_body": False})

    async def _sse_body(self, message: Message) -> None:
        body: bytes = message.get("body", b"")
        for event in self._decoder.feed(body):
            if event.data == DONE:
                continue
            self._answer_bytes += len(event.data)
            try:
                head = _head_decoder.decode(event.data)
            except msgspec.DecodeError:
                continue
            self._errored = self._errored or head.error is not None
            self._first = self._first or head
            self._usage = head.usage or self._usage
        if message.get("more_body", False) or self._errored or not body.endswith(DONE_EVENT):
            await self._next(message)
            return
        cache_stats, performance, _ = self._extras()
        first = self._first or _Head()
        chunk: dict[str, Any] = {
            "id": first.id,
            "object": first.object,
            "created": first.created,
            "model": first.model,
            "choices": [],
            "cache_stats": cache_stats,
            "performance": performance,
            "request_id": self._request_id,
        }
        extra = sse_event(msgspec.json.encode(chunk))
        await self._next({**message, "body": body[: -len(DONE_EVENT)] + extra + DONE_EVENT})

    def _extras(self) -> tuple[CacheStatsExtra, PerformanceExtra, int]:
        """`cache_stats`, `performance` and `usage.cached_tokens`, as of now."""
        call, now = self._call, time.perf_counter()
        hit = call.outcome == "hit"
        total = now - self._started
        if hit:
            cache_s = now - call.cache_started if call.cache_started is not None else 0.0
            inference_s = 0.0
        else:
            cache_s = call.lookup_s
            inference_s = now - call.forward_started if call.forward_started is not None else 0.0
        usage = self._usage
        engine_cached = (usage.cached_tokens or 0) if usage is not None else 0
        cached_tokens = usage.prompt_tokens if hit and usage is not None else engine_cached
        tenant = call.tenant
        cache_stats = CacheStatsExtra(
            cache_used=hit or engine_cached > 0,
            hit_rate=percent(tenant.hit_rate),
            cache_hits=tenant.hits,
            cache_misses=tenant.misses + tenant.refreshes,
            prefix_matches=int(not hit and engine_cached > 0),
        )
        performance = PerformanceExtra(
            total_time_ms=round(total * 1e3, 3),
            cache_time_ms=round(cache_s * 1e3, 3),
            inference_time_ms=round(inference_s * 1e3, 3),
            tokens_per_second=(
                round(usage.completion_tokens / total, 2) if usage is not None and total > 0 else None
            ),
            memory_usage_bytes=self._answer_bytes if call.outcome != "bypass" else 0,
        )
        return cache_stats, performance, cached_tokens
