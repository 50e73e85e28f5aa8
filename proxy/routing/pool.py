"""The worker pool: the `proxy.router.Router` the request path uses.

`acquire` tokenizes the request (only for policies that read tokens), lets the policy choose among
the available workers, inserts the prompt into the chosen worker's tree, charges its queued work and
returns a `PoolLease`. `PoolLease.release` uncharges it, feeds the breaker and corrects the tree
with the engine-reported `cached_tokens`. Workers are added and removed at run time; a removed
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
from adapters.schema import Usage
from adapters.upstream_client import DEFAULT_HEALTH_TIMEOUT_S
from proxy.routing.affinity import AFFINITY_REASON, preferred_worker
from proxy.routing.config import DEFAULT_CAPACITY_TOKENS, RoutingSettings, WorkerSpec
from proxy.routing.health import HealthMonitor
from proxy.routing.observe import RoutingObserver
from proxy.routing.policies import Decision, LeastLoad, RoutingContext
from proxy.routing.prompts import PromptTokens
from proxy.routing.registry import build_policy, worker_id_of
from proxy.routing.worker import InFlight, Worker
from proxy.telemetry.prometheus import MetricsRegistry

logger = logging.getLogger("radixgate.routing")

EngineFactory = Callable[[WorkerSpec], Engine]
BYTES_PER_TOKEN = 4
"""Prompt size estimate for policies that do not tokenize (only their load accounting uses it)."""


class PoolLease:
    """One attempt's hold on one worker (`proxy.router.WorkerLease`)."""

    __slots__ = (
        "_charge",
        "_pool",
        "_predicted",
        "_prompt_tokens",
        "_released",
        "_worker",
        "engine",
        "worker_id",
    )

    def __init__(
        self, pool: WorkerPool, worker: Worker, charge: InFlight, prompt_tokens: int, predicted: int
    ):
        self._pool = pool
        self._worker = worker
        self._charge = charge
        self._prompt_tokens = prompt_tokens
        self._predicted = predicted
        self._released = False
        self.worker_id = worker.id
        self.engine = worker.engine

    def release(self, *, usage: Usage | None, failed: bool) -> None:
        """End the attempt (idempotent)."""
        if self._released:
            return
        self._released = True
        worker = self._worker
        worker.settle(self._charge, failed=failed)
        if failed:
            self._pool.observer.failed(worker.id)
        elif (
            usage is not None
            and usage.cached_tokens is not None
            and usage.prompt_tokens
            and self._prompt_tokens
        ):
            # Compare as fractions: the router's tokens (maybe UTF-8 bytes) need not be the engine's.
            predicted = self._predicted / self._prompt_tokens
            reported = usage.cached_tokens / usage.prompt_tokens
            worker.correct(
                usage.prompt_tokens,
                round(predicted * usage.prompt_tokens),
                round(reported * usage.prompt_tokens),
            )
        if worker.draining and worker.in_flight == 0:
            self._pool.finish_drain(worker)


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
        self.policy = build_policy(settings.policy, settings.cache_aware)
        self._least_load = LeastLoad()
        self.prompts = PromptTokens(settings.tokenizers, settings.cache_aware.expected_output_tokens)
        self.observer = RoutingObserver.create(metrics, tracer, lambda: self._workers.values())
        self.health = HealthMonitor(
            settings,
            health_timeout_s,
            lambda: self._workers.values(),
            on_change=self._learn_models,
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
            self.observer.no_worker(model)
            raise EngineOverloaded(f"No healthy worker is available for model `{model}`.")
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
        if len(serving) == 1:  # one worker serves the model: nothing to weigh
            decision = Decision(worker=candidates[0], reason="only")
        else:
            context = RoutingContext(
                tokens=tokens, expected_output=expected, session_key=request.params.user, now=now
            )
            kept = preferred_worker(request, candidates, self.settings.cache_aware)
            if kept is not None:
                decision = Decision(worker=kept, match_tokens=kept.match(tokens), reason=AFFINITY_REASON)
            else:
                decision = policy.choose(candidates, context)
        worker = decision.worker
        if tokens:
            uncached = len(tokens) - decision.match_tokens
            if worker.remember(tokens) and worker.id not in self._trims:
                self._trims.add(worker.id)
                asyncio.get_running_loop().call_soon(self._trim, worker)
        else:
            uncached = len(request.raw_body) // BYTES_PER_TOKEN
        settings = self.settings.cache_aware
        charge = worker.charge(uncached, settings.decode_weight * expected, settings.prefill_hold_s, now)
        worker.queue_prefill(uncached, settings.prefill_tokens_per_s, now)
        seconds = time.perf_counter() - started
        self.observer.decided(
            policy.name, decision, candidates, len(exclude), len(tokens), tokenizer_kind, seconds
        )
        return PoolLease(self, worker, charge, len(tokens), decision.match_tokens)

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
        return states

    async def start(self) -> None:
        """Load in-process engines and the routing tokenizers, check every worker once (so readiness
        is known when serving starts), then keep checking. An embedded engine's load is awaited
        here, not inside the first check, whose timeout would mark it down until the next round."""
        await asyncio.gather(asyncio.to_thread(self.prompts.load), *map(_preload, self._workers.values()))
        await self.health.check_all()
        await asyncio.gather(*map(_detect_responses, self._workers.values()))
        self.health.start()

    async def aclose(self) -> None:
        await self.health.stop()
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
