"""Adds the seed's response extras (`usage.cached_tokens`, `cache_stats`, `performance`, `request_id`)
to an answer of a cached endpoint as it passes through the pipeline's `Responder`.

Errors are raised before any answer, so they pass unchanged. A JSON answer gets the extras in its
body. A stream passes chunk by chunk; one extra chunk with no choices (the shape of OpenAI's usage
chunk) carrying the extras goes out just before its end, unless the stream ended with an error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from adapters.schema import Usage
from proxy.cache.radix_stats import percent
from proxy.cache.step import CachedCall
from proxy.errors import ErrorDetail
from proxy.responder import REQUEST_ID_HEADER, Headers, Responder


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
    """Wraps the `Responder` of one cached-endpoint request and adds the extras on the way."""

    __slots__ = ("_answer_bytes", "_call", "_first", "_next", "_request_id", "_started", "_usage")

    def __init__(
        self, responder: Responder, call: CachedCall, started: float, request_id: str | None
    ) -> None:
        self._next = responder
        self._call = call
        self._started = started
        self._request_id = request_id
        self._first: _Head | None = None
        self._usage: Usage | None = None
        self._answer_bytes = 0

    async def send_json(self, body: bytes, headers: Headers) -> None:
        self._take_request_id(headers)
        try:
            fields = _object_decoder.decode(body)
            head = _head_decoder.decode(body)
        except msgspec.DecodeError:
            await self._next.send_json(body, headers)
            return
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
        await self._next.send_json(msgspec.json.encode(fields), headers)

    async def start_stream(self, headers: Headers, first: bytes) -> None:
        self._take_request_id(headers)
        self._observe(first)
        await self._next.start_stream(headers, first)

    async def send_chunk(self, payload: bytes) -> None:
        self._observe(payload)
        await self._next.send_chunk(payload)

    async def end_stream(self, error: ErrorDetail | None = None) -> None:
        if error is None:
            await self._next.send_chunk(self._extras_chunk())
        await self._next.end_stream(error)

    async def send_stream(self, headers: Headers, chunks: Sequence[bytes]) -> None:
        self._take_request_id(headers)
        for chunk in chunks:
            self._observe(chunk)
        await self._next.send_stream(headers, [*chunks, self._extras_chunk()])

    def _take_request_id(self, headers: Headers) -> None:
        if self._request_id is None:
            for name, value in headers:
                if name == REQUEST_ID_HEADER:
                    self._request_id = value.decode("latin-1")

    def _observe(self, payload: bytes) -> None:
        self._answer_bytes += len(payload)
        try:
            head = _head_decoder.decode(payload)
        except msgspec.DecodeError:
            return
        self._first = self._first or head
        self._usage = head.usage or self._usage

    def _extras_chunk(self) -> bytes:
        """One chunk with no choices (the shape of OpenAI's usage chunk) carrying the extras."""
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
        return msgspec.json.encode(chunk)

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
            speculation_hits=usage.accepted_prediction_tokens if usage is not None and not hit else 0,
            # A request that asked for the window and whose kept cache started from cached pages.
            window_reuse=int(not hit and engine_cached > 0 and call.sliding_window is True),
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
