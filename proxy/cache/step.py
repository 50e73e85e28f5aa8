"""The response-cache step of the request path, between authentication and forwarding.

`ResponseCacheStep.respond` wraps the pipeline's `forward(responder)` (which routes, calls the engine and
answers with a JSON body or a stream) and decides, per request:

    bypass   the cache takes no part: caching is off, the request is sampled (temperature not 0
             and no seed), `Cache-Control: no-store`, or `enable_caching: false` on a cached endpoint
    hit      a stored answer is replayed: the same JSON body, or the same SSE chunks then `[DONE]`;
             the engine is not called
    miss     the engine answers; a complete answer (status 200, every choice finished, no error
             event, not cut by a disconnect) is stored once the handler has returned (a callback on
             the next loop turn, or a task when the store may block on I/O).
             `Cache-Control: no-cache` skips the lookup but still stores, so it
             refreshes the entry. While the admission gate is selective (`cachelayer.admission`:
             no hits lately), a body it has not seen is looked up but its answer is not stored:
             admission decides what is stored, never what is read.

Every answer carries `x-radixgate-cache: hit|miss|bypass`. A stream is recorded as it passes to the
front door's `Responder` and a JSON answer is the `Completion` that `forward` sent, so what is stored
is exactly what the client received.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from opentelemetry import trace

from adapters.base import Completion, EngineRequest
from cachelayer.admission import AdmissionGate
from cachelayer.responses import ResponseCache, StoredResponse, is_deterministic
from proxy.cache.answers import Recorder, replay, stored_response
from proxy.cache.counters import CacheCounters, CacheMonitor
from proxy.responder import Headers, Responder
from proxy.telemetry import semconv

logger = logging.getLogger("radixgate.cache")

Outcome = Literal["hit", "miss", "bypass"]
Forward = Callable[[Responder], Awaitable[Completion | None]]
"""Sends the engine's answer through a `Responder`; returns the `Completion` it sent when that was a
whole JSON answer (None for a stream: the step then records its chunks)."""

CACHE_HEADER = b"x-radixgate-cache"


@dataclass(slots=True)
class CachedCall:
    """What a `/v1/cached/*` request asked of the cache, and what the step decided.

    The step fills in the outcome and timings *before* the answer's first byte, so the endpoint can
    decorate the answer as it passes.
    """

    enable_caching: bool = True
    label: str | None = None
    """The request's `cache_key`: opts a sampled request in and partitions entries."""
    speculation: bool | None = None
    """The request's `enable_speculation` (None: the engine's default)."""
    sliding_window: bool | None = None
    """The request's `enable_sliding_window` (None: the engine's default); reaches the engine."""
    outcome: Outcome = "bypass"
    cache_started: float | None = None
    """`perf_counter()` when the lookup began (None when there was none)."""
    lookup_s: float = 0.0
    """Seconds the lookup took."""
    forward_started: float | None = None
    """`perf_counter()` when forwarding to the engine began (None on a hit)."""
    tenant: CacheCounters = field(default_factory=CacheCounters)
    """The caller's tenant's live counters."""


class _Plan(NamedTuple):
    key: bytes
    lookup: bool


class ResponseCacheStep:
    """See the module docstring. `cache` None means the response cache is off (every answer: bypass)."""

    __slots__ = ("_gates", "_pending", "_queued", "_tracer", "admission", "cache", "monitor")

    def __init__(
        self,
        cache: ResponseCache | None,
        monitor: CacheMonitor | None = None,
        admission: AdmissionGate | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.cache = cache
        self._tracer = None if tracer is None or isinstance(tracer, trace.NoOpTracer) else tracer
        """Starts the `radixgate.response_cache` span of each lookup; None: no spans."""
        self.monitor = monitor or CacheMonitor()
        self.admission = admission or AdmissionGate()
        """The gate's settings; each tenant gets a gate of its own (`admission_for`), so one tenant's
        flood of unique requests never turns the gate selective for another."""
        self._gates: dict[str, AdmissionGate] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._queued = 0
        """Stores scheduled with `call_soon` and not yet run."""

    async def respond(
        self,
        request: EngineRequest,
        call: CachedCall | None,
        cache_control: bytes | None,
        headers: Headers,
        responder: Responder,
        forward: Forward,
    ) -> None:
        """Answer `request` from the cache, or through `forward(responder)` (recording it on a miss).

        `call`: a cached endpoint's options (None on the plain routes); `cache_control`: the caller's
        directives. `headers` are the response headers `forward` will send; the cache header is added.
        """
        counters = self.monitor.tenant(request.tenant_id)
        if call is not None:
            call.tenant = counters
        lookup = self._lookup(request, cache_control, call)
        # Admission decides what is stored, never what is read: an entry stored earlier (or by the
        # previous process, on disk) is still found while the gate is selective.
        gate = self.admission_for(request.tenant_id)
        admitted = lookup is None or gate.admit(request.raw_body)
        plan = None if lookup is None else self._plan(request, call, lookup)
        if plan is None:
            headers.append((CACHE_HEADER, b"bypass"))
            self.monitor.count(counters, "bypasses")
            if call is not None:
                call.outcome, call.forward_started = "bypass", time.perf_counter()
            await forward(responder)
            return
        span = (
            None
            if self._tracer is None
            else self._tracer.start_span(semconv.RESPONSE_CACHE_SPAN_NAME, kind=trace.SpanKind.INTERNAL)
        )
        started = time.perf_counter()
        stored = None
        if plan.lookup:
            cache = self.cache
            if cache is not None and cache.blocking and cache.get_blocks(plan.key):
                stored = await self.get(plan.key)
            else:  # memory tiers answer in microseconds: no coroutine, no thread
                stored = self._get_now(plan.key)
            self.monitor.lookup_done(time.perf_counter() - started)
        if call is not None:
            call.cache_started, call.lookup_s = started, time.perf_counter() - started
        hit = stored is not None and stored.streamed == request.stream
        if plan.lookup:
            gate.observe(hit)
        if span is not None:
            span.set_attributes(
                {
                    semconv.RESPONSE_CACHE_HIT: hit,
                    semconv.RESPONSE_CACHE_OUTCOME: "hit" if hit else "miss" if plan.lookup else "refresh",
                    semconv.RESPONSE_CACHE_LOOKUP_SECONDS: time.perf_counter() - started,
                }
            )
        if hit:
            assert stored is not None
            headers.append((CACHE_HEADER, b"hit"))
            self.monitor.count(counters, "hits")
            if call is not None:
                call.outcome = "hit"
            try:
                await replay(responder, stored, headers)
            finally:
                if span is not None:
                    span.end()
            if self.monitor.hit_seconds is not None:
                self.monitor.hit_seconds.observe(time.perf_counter() - started)
            return
        if span is not None:
            span.end()
        headers.append((CACHE_HEADER, b"miss"))
        self.monitor.count(counters, "misses" if plan.lookup else "refreshes")
        if call is not None:
            call.outcome, call.forward_started = "miss", time.perf_counter()
        if not admitted:  # the cache is not earning hits and this body is new: not stored
            self.monitor.count(counters, "not_admitted")
            await forward(responder)
            return
        # A stream is recorded chunk by chunk; a JSON answer comes back whole from `forward`.
        recorder = Recorder(responder) if request.stream else None
        completion = await forward(responder if recorder is None else recorder)
        answer: Recorder | Completion | None = recorder or completion
        if answer is None:  # a JSON answer that was not whole (an error status): nothing to store
            return
        # Stored after the handler returns, so the answer's end (and its server span) is not delayed.
        # A store that cannot block (memory tiers, L3 written behind) is a plain callback on the next
        # loop turn: a task per miss cost more than the memory write itself.
        loop = asyncio.get_running_loop()
        if self.cache is not None and self.cache.puts_block:
            task = loop.create_task(self._store_answer(plan.key, answer, counters))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        else:
            self._queued += 1
            loop.call_soon(self._store_now, plan.key, answer, counters)

    def admission_for(self, tenant_id: str) -> AdmissionGate:
        """The admission gate of one tenant (created on its first request)."""
        gate = self._gates.get(tenant_id)
        if gate is None:
            gate = self._gates[tenant_id] = self.admission.fresh()
        return gate

    async def drain(self) -> None:
        """Wait for answers still being stored (before the store is closed)."""
        while self._pending or self._queued:
            if self._pending:
                await asyncio.gather(*self._pending, return_exceptions=True)
            else:
                await asyncio.sleep(0)  # queued callbacks run on this turn of the loop

    def _store_now(self, key: bytes, answer: Recorder | Completion, counters: CacheCounters) -> None:
        """Store an answer into a store whose `put` never waits on I/O."""
        self._queued -= 1
        cache = self.cache
        if cache is None:
            return
        monitor = self.monitor
        started = time.perf_counter() if monitor.profile is not None else 0.0  # timed only when profiled
        response = stored_response(answer)
        if response is None:
            monitor.count(counters, "not_stored")
            return
        try:
            cache.put(key, response, cost=max(1.0, float(response.completion_tokens)))
        except Exception:  # the cache must never fail a request: a broken store loses the entry
            logger.exception("response cache store failed")
            return
        monitor.count(counters, "stores")
        if monitor.profile is not None:
            monitor.store_done(time.perf_counter() - started)

    async def _store_answer(self, key: bytes, answer: Recorder | Completion, counters: CacheCounters) -> None:
        started = time.perf_counter()
        response = stored_response(answer)
        if response is None:
            self.monitor.count(counters, "not_stored")
        elif await self.put(key, response):
            self.monitor.count(counters, "stores")
            self.monitor.store_done(time.perf_counter() - started)

    def key_for(self, request: EngineRequest, label: str | None = None) -> bytes | None:
        """The cache key of `request`, or None when the response cache is off."""
        if self.cache is None:
            return None
        if request.sliding_window is not None:  # an answer with (or without) the window is another answer
            label = f"{label or ''}\x00sliding_window={int(request.sliding_window)}"
        try:
            return self.cache.key(
                request.raw_body,
                model=request.model,
                operation=request.operation,
                streamed=request.stream,
                tenant_salt=request.cache_salt,
                label=label,
            )
        except ValueError:
            return None  # the route decoded it already; a body it accepts is always a JSON object

    async def get(self, key: bytes) -> StoredResponse | None:
        """The stored answer under `key`; a store that fails is logged and answers None (a miss)."""
        if self.cache is None:
            return None
        try:
            if self.cache.get_blocks(key):
                return await asyncio.to_thread(self.cache.get, key)
            return self.cache.get(key)
        except Exception:  # the cache must never fail a request: a broken store is a miss
            logger.exception("response cache lookup failed")
            return None

    def _get_now(self, key: bytes) -> StoredResponse | None:
        """`get` for a lookup that cannot wait on I/O, called without a coroutine."""
        if self.cache is None:
            return None
        try:
            return self.cache.get(key)
        except Exception:  # the cache must never fail a request: a broken store is a miss
            logger.exception("response cache lookup failed")
            return None

    async def put(self, key: bytes, response: StoredResponse) -> bool:
        """Store `response` (weighed by its completion tokens); False when the store failed."""
        cache = self.cache
        if cache is None:
            return False

        def put() -> None:
            cache.put(key, response, cost=max(1.0, float(response.completion_tokens)))

        try:
            if cache.puts_block:
                await asyncio.to_thread(put)
            else:
                put()
        except Exception:
            logger.exception("response cache store failed")
            return False
        return True

    def _lookup(
        self, request: EngineRequest, cache_control: bytes | None, call: CachedCall | None
    ) -> bool | None:
        """Whether to look `request` up (False: `no-cache`, store only); None to bypass the cache."""
        if self.cache is None or (call is not None and not call.enable_caching):
            return None
        if request.operation == "responses":  # the worker stores each answer under its own id
            return None
        params = request.params
        deterministic = request.operation == "embeddings" or is_deterministic(params.temperature, params.seed)
        if (call is None or call.label is None) and not deterministic:
            return None
        if cache_control is None:
            return True
        directives = {part.strip().lower() for part in cache_control.split(b",")}
        if b"no-store" in directives:
            return None
        return b"no-cache" not in directives

    def _plan(self, request: EngineRequest, call: CachedCall | None, lookup: bool) -> _Plan | None:
        """The key to use and whether to look it up; None to bypass the cache."""
        if self.cache is None:
            return None
        key = self.key_for(request, call.label if call is not None else None)
        return None if key is None else _Plan(key, lookup)
