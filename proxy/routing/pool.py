"""The worker pool: the `proxy.router.Router` the request path uses.

`acquire` tokenizes the request (only for policies that read tokens), lets the policy choose among
the available workers, inserts the prompt into the chosen worker's tree, charges its queued work and
returns a `PoolLease` (`proxy.routing.lease`). When every worker of a model is marked down, the most
recently healthy one is tried anyway (panic mode). Workers are added and removed at run time; a removed
worker drains: it takes no new request and is closed when its last lease is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from adapters.base import Engine, EngineRequest
from adapters.engine_metrics import FlushesCache, LoadsInProcess, ServesResponses
from adapters.errors import EngineOverloaded
from adapters.upstream_client import DEFAULT_HEALTH_TIMEOUT_S
from proxy.routing.affinity import AFFINITY_REASON, preferred_worker
from proxy.routing.config import DEFAULT_CAPACITY_TOKENS, RoutingSettings, WorkerSpec
from proxy.routing.health import HealthMonitor
from proxy.routing.kv_discovery import rediscover
from proxy.routing.kv_events import stop as stop_feed
from proxy.routing.lease import PoolLease, RoutedPrompt
from proxy.routing.observe import RoutingObserver
from proxy.routing.policies import Decision, LeastLoad, RoutingContext
from proxy.routing.prompts import PromptTokens
from proxy.routing.registry import build_policy, worker_id_of
from proxy.routing.worker import DEFAULT_BYTES_PER_TOKEN, Worker
from proxy.telemetry.prometheus import MetricsRegistry

logger = logging.getLogger("radixgate.routing")

EngineFactory = Callable[[WorkerSpec], Engine]


@dataclass(slots=True)
class DrainResult:
    worker_id: str
    state: str
    """"removed" when the worker was idle, "draining" while in-flight requests finish."""
    in_flight: int


class WorkerPool:
    """Routes each request to one of N engine workers with a named policy."""

    def __init__(
        self,
        models: Sequence[str],
        workers: Sequence[WorkerSpec],
        settings: RoutingSettings,
        *,
        engine_factory: EngineFactory,
        health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S,
        metrics: MetricsRegistry | None = None,
        tracer: Tracer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._models = list(dict.fromkeys(models))
        self._engine_factory = engine_factory
        self._clock = clock
        self._workers: dict[str, Worker] = {}
        self._drain_deadlines: set[asyncio.Task[None]] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._trims: set[str] = set()  # workers whose tree trim is scheduled
        self._feeds: dict[str, asyncio.Task[None]] = {}  # KV-event subscriptions by worker id
        self.policy = build_policy(settings.policy, settings.cache_aware)
        self._least_load = LeastLoad()
        self.prompts = PromptTokens(settings.tokenizers, settings.cache_aware.expected_output_tokens)
        self.observer = RoutingObserver.create(metrics, tracer, lambda: self._workers.values())
        self.health = HealthMonitor(
            settings,
            health_timeout_s,
            lambda: self._workers.values(),
            on_change=self._learn_models,
            on_up=lambda worker: self._came_up(worker, health_timeout_s),
            tree_ttl_s=settings.cache_aware.tree_ttl_s,
        )
        for spec in workers:
            self._add(spec)

    # ---- Router protocol --------------------------------------------------------------------

    def model_ids(self) -> list[str]:
        return list(self._models)

    def has_model(self, model: str) -> bool:
        return model in self._models

    async def acquire(self, request: EngineRequest, *, exclude: frozenset[str] = frozenset()) -> PoolLease:
        """Choose a worker for `request`; raises `EngineOverloaded` when none is available."""
        model = request.model
        native = request.operation == "responses"  # passed through: only workers that serve it
        serving = [w for w in self._workers.values() if w.serves(model) and (w.responses_api or not native)]
        candidates = [w for w in serving if w.id not in exclude and w.available()]
        if not candidates:
            # Panic mode (as Envoy's): when every circuit is open, trying a live worker beats refusing all.
            candidates = [w for w in serving if w.id not in exclude and w.available(ignore_breaker=True)]
        route = request.route
        if route is not None and route.required:  # the conversation's state lives on that worker
            candidates = [w for w in candidates if w.id == route.prefer_worker]
        if not candidates:
            last = self._last_resort(serving, exclude)
            if last is None:
                self.observer.no_worker(model)
                raise EngineOverloaded(f"No healthy worker is available for model `{model}`.")
            return self._panic_lease(model, last, request)
        tokens: array[int] = array("I")
        tokenizer_kind = "none"
        # A model only one worker serves leaves nothing to choose: no tokens, no tree (tokenizing and
        # tree upkeep are the largest part of a routed request's CPU).
        embeddings = request.operation == "embeddings"  # no prefix KV: the least loaded worker
        policy = self._least_load if embeddings else self.policy
        if policy.needs_tokens and len(serving) > 1:
            tokens, tokenizer_kind = await self.prompts.tokens(request, candidates)
        started = time.perf_counter()
        now = self._clock()
        for worker in candidates:
            worker.expire_prefills(now)
        expected = 0 if embeddings else self.prompts.expected_output(request)
        scales = {w.id: w.scale_for(model, tokenizer_kind) for w in candidates} if tokens else {}
        if len(serving) == 1:  # one worker serves the model: nothing to weigh
            decision = Decision(worker=candidates[0], reason="only")
        else:
            exact = tokens and tokenizer_kind != "bytes"
            context = RoutingContext(
                tokens=tokens,
                expected_output=expected,
                session_key=request.params.user,
                now=now,
                engine_tokens=(tokens[1:] if request.cache_salt else tokens) if exact else None,
                salt=request.cache_salt,
                units_per_token=scales,
            )
            kept = preferred_worker(request, candidates, self.settings.cache_aware)
            if kept is not None:
                match = round(kept.match(tokens) / scales[kept.id]) if tokens else 0
                decision = Decision(worker=kept, match_tokens=match, reason=AFFINITY_REASON)
            else:
                decision = policy.choose(candidates, context)
        worker = decision.worker
        routed = None
        if tokens:
            prompt_tokens = len(tokens) / scales[worker.id]
            uncached = max(0.0, prompt_tokens - decision.match_tokens)
            routed = RoutedPrompt(model, tokenizer_kind, len(tokens) - bool(request.cache_salt))
            if worker.remember(tokens) and worker.id not in self._trims:
                self._trims.add(worker.id)
                asyncio.get_running_loop().call_soon(self._trim, worker)
        else:
            prompt_tokens = 0.0
            uncached = len(request.raw_body) / DEFAULT_BYTES_PER_TOKEN
        settings = self.settings.cache_aware
        charge = worker.charge(uncached, settings.decode_weight * expected, settings.prefill_hold_s, now)
        worker.queue_prefill(uncached, settings.prefill_tokens_per_s, now)
        if worker.kv_events is not None:
            worker.kv_events.dispatched()
        seconds = time.perf_counter() - started
        prompt = round(prompt_tokens)
        span = self.observer.decided(
            policy.name, decision, candidates, len(exclude), prompt, tokenizer_kind, seconds
        )
        return PoolLease(self, worker, charge, prompt_tokens, decision.match_tokens, routed, span=span)

    def _last_resort(self, serving: Sequence[Worker], exclude: frozenset[str]) -> Worker | None:
        """When every worker of a model is marked down, the most recently healthy one that this
        request has not failed on yet (a worker never seen up counts as longest ago); None when
        the model has a worker that is not down (it is busy or its circuit is open: no panic)."""
        if any(w.health != "down" and not w.draining for w in serving):
            return None
        spare = [w for w in serving if w.id not in exclude and not w.draining]
        return max(spare, key=lambda w: w.last_healthy, default=None)

    def _panic_lease(self, model: str, worker: Worker, request: EngineRequest) -> PoolLease:
        """A lease on a worker marked down, tried rather than answering 503 at once: health checks
        can lag an upstream that has just come (back) up. No tree upkeep: its cache is unknown."""
        settings = self.settings.cache_aware
        expected = self.prompts.expected_output(request)
        uncached = len(request.raw_body) / DEFAULT_BYTES_PER_TOKEN
        now = self._clock()
        charge = worker.charge(uncached, settings.decode_weight * expected, settings.prefill_hold_s, now)
        self.observer.panicked(model, worker.id)
        span = self.observer.decided(
            self.policy.name, Decision(worker=worker, reason="panic"), [worker], 0, 0, "none", 0.0
        )
        return PoolLease(self, worker, charge, 0.0, 0, panic=True, span=span)

    def panicking(self) -> dict[str, str]:
        """Models in panic mode (every worker serving them marked down), with the worker that would
        be tried next: for `GET /health` and `/admin/workers`."""
        chosen = {}
        for model in self._models:
            serving = [w for w in self._workers.values() if w.serves(model)]
            last = self._last_resort(serving, frozenset()) if serving else None
            if last is not None:
                chosen[model] = last.id
        return chosen

    def recheck_soon(self, worker: Worker) -> None:
        """Check a worker's health now (a request it was tried on in panic mode succeeded)."""
        task = asyncio.get_running_loop().create_task(self.health.check(worker))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def readiness(self) -> dict[str, bool]:
        return {
            model: any(w.health == "up" and not w.draining for w in self._workers.values() if w.serves(model))
            for model in self._models
        }

    def component_states(self) -> dict[str, str]:
        states = {}
        for worker in self._workers.values():
            if worker.health == "down":
                states[worker.id] = "down"
            elif worker.health == "up" and worker.breaker.state == "closed" and not worker.draining:
                states[worker.id] = "operational"
            else:
                states[worker.id] = "degraded"
        # A model whose workers are all down is still served, on the most recently healthy one.
        for model in self.panicking():
            states[f"panic:{model}"] = "degraded"
        return states

    async def start(self) -> None:
        """Load in-process engines and the routing tokenizers, check every worker once (so readiness
        is known when serving starts), then keep checking. An embedded engine's load is awaited
        here, not inside the first check, whose timeout would mark it down until the next round."""
        await asyncio.gather(asyncio.to_thread(self.prompts.load), *map(_preload, self._workers.values()))
        for worker in self._workers.values():
            self._subscribe(worker)
        await self.health.check_all()
        await asyncio.gather(*map(_detect_responses, self._workers.values()))
        self.health.start()

    async def aclose(self) -> None:
        await self.health.stop()
        for task in list(self._feeds.values()):
            await stop_feed(task)
        self._feeds.clear()
        for task in list(self._drain_deadlines):
            task.cancel()
        workers, self._workers = list(self._workers.values()), {}
        await asyncio.gather(*self._closing, *(w.engine.aclose() for w in workers), return_exceptions=True)

    # ---- run-time membership ----------------------------------------------------------------

    def passes_responses_through(self, model: str) -> bool:
        """True when every live worker of `model` serves `/v1/responses` itself (and one does)."""
        live = [
            w for w in self._workers.values() if w.serves(model) and not w.draining and w.health != "down"
        ]
        return bool(live) and all(w.responses_api for w in live)

    def worker(self, worker_id: str) -> Worker | None:
        """The worker named `worker_id`, if it is in the pool."""
        return self._workers.get(worker_id)

    def workers(self) -> list[Worker]:
        """Workers in the pool, draining ones included."""
        return list(self._workers.values())

    async def add_worker(self, spec: WorkerSpec) -> Worker:
        """Add a worker and check its health at once; ValueError if its id is taken."""
        worker = self._add(spec)
        self._subscribe(worker)
        await self.health.check(worker)
        await _detect_responses(worker)
        return worker

    def remove_worker(self, worker_id: str) -> DrainResult:
        """Stop routing to a worker; close it once idle or after `drain_timeout_s`. KeyError if unknown."""
        worker = self._workers[worker_id]
        worker.draining = True
        if worker.in_flight == 0:
            self.finish_drain(worker)
            return DrainResult(worker_id, "removed", 0)
        task = asyncio.create_task(self._drain_deadline(worker))
        self._drain_deadlines.add(task)
        task.add_done_callback(self._drain_deadlines.discard)
        return DrainResult(worker_id, "draining", worker.in_flight)

    def finish_drain(self, worker: Worker) -> None:
        """Forget a drained worker and close its engine."""
        if self._workers.get(worker.id) is not worker:
            return
        del self._workers[worker.id]
        self.health.forget(worker.id)
        feed = self._feeds.pop(worker.id, None)
        if feed is not None:
            feed.cancel()
        logger.info("worker %s removed", worker.id)
        task = asyncio.get_running_loop().create_task(worker.engine.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def flush_caches(self) -> dict[str, bool]:
        """Flush every engine's prefix cache (where supported) and every routing tree."""
        results: dict[str, bool] = {}
        for worker in list(self._workers.values()):
            worker.forget()
            if isinstance(worker.engine, FlushesCache):
                try:
                    results[worker.id] = await worker.engine.flush_cache()
                except Exception as exc:  # one engine's refusal must not stop the others
                    logger.warning("flushing %s failed: %r", worker.id, exc)
                    results[worker.id] = False
        return results

    def _add(self, spec: WorkerSpec) -> Worker:
        worker_id = spec.id or worker_id_of(spec)
        if worker_id in self._workers:
            raise ValueError(f"worker id {worker_id!r} is already in the pool")
        capacity, source = (
            (spec.capacity_tokens, "config") if spec.capacity_tokens else (DEFAULT_CAPACITY_TOKENS, "default")
        )
        engine = self._engine_factory(spec)
        worker = Worker.create(worker_id, spec, engine, self.settings.breaker, capacity, source, self._clock)
        self._workers[worker_id] = worker
        self._learn_models(worker)
        return worker

    def _subscribe(self, worker: Worker) -> None:
        """Start following the worker's KV events, if it publishes them."""
        if worker.kv_events is not None and worker.id not in self._feeds:
            task = asyncio.get_running_loop().create_task(
                worker.kv_events.run(), name=f"kv-events-{worker.id}"
            )
            self._feeds[worker.id] = task

    async def _came_up(self, worker: Worker, timeout_s: float) -> None:
        """A worker seen up: find its models' tokenizers and, unless configured, its KV events."""
        await self.prompts.discover(worker, timeout_s)
        if self.settings.discover_kv_events and await rediscover(worker, timeout_s, self._clock):
            task = self._feeds.pop(worker.id, None)
            if task is not None:  # the engine restarted with other sockets, or without events
                task.cancel()
            self._subscribe(worker)

    def _trim(self, worker: Worker) -> None:
        self._trims.discard(worker.id)
        worker.trim()

    def _learn_models(self, worker: Worker) -> None:
        for model in worker.models:
            if model not in self._models:
                self._models.append(model)

    async def _drain_deadline(self, worker: Worker) -> None:
        await asyncio.sleep(self.settings.drain_timeout_s)
        if worker.draining:
            logger.warning("worker %s closed with %d requests still in flight", worker.id, worker.in_flight)
            with contextlib.suppress(Exception):
                self.finish_drain(worker)


async def _detect_responses(worker: Worker) -> None:
    """Settle whether the worker serves `/v1/responses` itself: as configured, else asked once."""
    configured = worker.spec.responses_api
    if configured is not None:
        worker.responses_api = configured
    elif isinstance(worker.engine, ServesResponses) and worker.health == "up":
        worker.responses_api = await worker.engine.serves_responses()


async def _preload(worker: Worker) -> None:
    if isinstance(worker.engine, LoadsInProcess):
        # A load that fails shows as an unhealthy worker (the health check tries again and logs why).
        with contextlib.suppress(Exception):
            await worker.engine.start()
