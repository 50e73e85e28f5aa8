"""Active health checks of every worker, and what the engines report while at it.

Each round checks all workers concurrently (`Engine.check_health`, bounded by `timeout_s`).
`failure_threshold` consecutive failures mark a worker down: its circuit opens and its tree is
dropped (a restarted engine has an empty cache). `success_threshold` consecutive successes bring
it back: the circuit closes. Engines that report their KV capacity (SGLang `max_total_num_tokens`)
size the worker's tree the first time they are seen up; engines with `/metrics` refresh their load.
A worker seen up is also asked for its models' tokenizer (`on_up`, `proxy.routing.discovery`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from adapters.engine_metrics import ListsModels, ReportsCapacity, ReportsLoad
from proxy.routing.config import RoutingSettings
from proxy.routing.worker import Worker

logger = logging.getLogger("radixgate.routing.health")


@dataclass(slots=True)
class _Streak:
    successes: int = 0
    failures: int = 0


@dataclass(slots=True)
class HealthMonitor:
    """Polls workers in the background; `check_all` also runs on demand (start-up, tests)."""

    settings: RoutingSettings
    """The thresholds and interval (`health_*`)."""
    timeout_s: float
    """Seconds one check may take before it counts as failed."""
    workers: Callable[[], Iterable[Worker]]
    on_change: Callable[[Worker], None] = lambda worker: None
    on_up: Callable[[Worker], Awaitable[None]] | None = None
    """Awaited each time a worker comes up, once its models are known (tokenizer discovery)."""
    tree_ttl_s: float | None = None
    _streaks: dict[str, _Streak] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start polling every `health_interval_s`."""
        self._task = asyncio.create_task(self._poll(), name="radixgate-routing-health")

    async def stop(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def check_all(self) -> None:
        """One round: check every worker now."""
        await asyncio.gather(*(self.check(worker) for worker in list(self.workers())))

    async def check(self, worker: Worker) -> None:
        """Check one worker and apply the thresholds."""
        ok = await self._probe(worker)
        streak = self._streaks.setdefault(worker.id, _Streak())
        if ok:
            worker.last_healthy = time.monotonic()
            streak.successes, streak.failures = streak.successes + 1, 0
            if worker.health != "up" and (
                worker.health == "unknown" or streak.successes >= self.settings.health_success_threshold
            ):
                await self._came_up(worker)
        else:
            streak.successes, streak.failures = 0, streak.failures + 1
            # A worker never seen up is down at its first failure; a known-good one gets the threshold.
            if worker.health == "unknown" or (
                worker.health == "up" and streak.failures >= self.settings.health_failure_threshold
            ):
                self._went_down(worker)
        if self.tree_ttl_s is not None:
            worker.tree.evict_expired(self.tree_ttl_s)

    def forget(self, worker_id: str) -> None:
        """Drop the streak of a removed worker."""
        self._streaks.pop(worker_id, None)

    async def _probe(self, worker: Worker) -> bool:
        """The health check's verdict; the engine's load figures are read after a good check, and a
        failure to read them (a proxy in front, metrics disabled) never marks the worker down."""
        try:
            async with asyncio.timeout(self.timeout_s):
                ok = await worker.engine.check_health()
        except Exception as exc:  # any failure of a probe only means "not healthy now"
            logger.debug("health check of %s failed: %r", worker.id, exc)
            return False
        if ok and isinstance(worker.engine, ReportsLoad):
            try:
                async with asyncio.timeout(self.timeout_s):
                    load = await worker.engine.load()
            except Exception as exc:  # load is optional input to routing, not a health verdict
                logger.debug("load of %s unknown: %r", worker.id, exc)
                worker.engine_load = {}
                worker.engine_speculation = None
                return ok
            worker.engine_speculation = load.speculation
            worker.engine_load = {
                key: value
                for key, value in (
                    ("running", load.running),
                    ("waiting", load.waiting),
                    ("kv_usage", load.kv_usage),
                    ("cache_hit_rate", load.cache_hit_rate),
                )
                if value is not None
            }
        return ok

    async def _came_up(self, worker: Worker) -> None:
        was_down = worker.health == "down"
        worker.health = "up"
        worker.breaker.reset()
        if was_down:
            worker.forget()
        logger.info("worker %s is up", worker.id)
        if not worker.spec.models and isinstance(worker.engine, ListsModels):
            try:
                async with asyncio.timeout(self.timeout_s):
                    worker.discovered_models = await worker.engine.list_models()
            except Exception as exc:  # the worker then serves whatever model it is asked for
                logger.debug("models of %s unknown: %r", worker.id, exc)
        if worker.spec.capacity_tokens is None and isinstance(worker.engine, ReportsCapacity):
            try:
                async with asyncio.timeout(self.timeout_s):
                    capacity = await worker.engine.kv_capacity_tokens()
            except Exception as exc:  # capacity is an optimisation; the default still works
                logger.debug("capacity of %s unknown: %r", worker.id, exc)
                capacity = None
            if capacity:
                worker.set_capacity(capacity, "engine")
        self.on_change(worker)
        if self.on_up is not None:
            await self.on_up(worker)

    def _went_down(self, worker: Worker) -> None:
        worker.health = "down"
        worker.breaker.trip()
        worker.forget()
        logger.warning("worker %s is down", worker.id)
        self.on_change(worker)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            await self.check_all()
