"""The simulated engines of `sim_core` on one discrete-event clock, for `benchmarks.routing.offline`."""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from benchmarks.routing.sim_core import SimConfig, SimEngine, SimRequest
from proxy.routing.lease import PoolLease


@dataclass(slots=True, eq=False)
class Job:
    """One request in the cluster, and who to tell when its answer arrives."""

    request: SimRequest
    lease: PoolLease | None
    sent: float
    done: Callable[[Job], Awaitable[None]]
    first_token: float | None = None


class OfflineCluster:
    """SimEngines on one simulated clock: each worker's next action (a prefill batch or a decode
    step) is an event, and so is each answer reaching its client, a seeded random share of
    `jitter_s` after the request ended (the HTTP hop and the host's scheduling, which keep real
    clients out of lockstep). The engines' own admission, decode and retirement steps run unchanged."""

    def __init__(self, config: SimConfig, workers: int, jitter_s: float, seed: int) -> None:
        self.config = config
        self.engines = [SimEngine(config) for _ in range(workers)]
        self.now = 0.0
        self._jitter_s = jitter_s
        self._rng = random.Random(seed)
        self._free_at = [0.0] * workers
        self._events: list[tuple[float, int, int, Job | None]] = []
        self._scheduled = [False] * workers
        self._jobs: list[dict[int, Job]] = [{} for _ in range(workers)]
        self._sequence = 0

    def submit(self, worker: int, job: Job) -> None:
        self._jobs[worker][id(job.request)] = job
        self._schedule(worker)

    def _push(self, at: float, worker: int, job: Job | None) -> None:
        self._sequence += 1
        heapq.heappush(self._events, (at, self._sequence, worker, job))

    def _schedule(self, worker: int) -> None:
        if not self._scheduled[worker]:
            self._scheduled[worker] = True
            self._push(max(self.now, self._free_at[worker]), worker, None)

    async def run(self) -> None:
        while self._events:
            self.now, _, worker, answered = heapq.heappop(self._events)
            if answered is not None:
                await answered.done(answered)
                # Let the pool's deferred work run (its tree trims, scheduled with `call_soon`), as
                # the gateway's event loop does between requests: without it no tree ever forgets.
                await asyncio.sleep(0)
                continue
            self._scheduled[worker] = False
            engine = self.engines[worker]
            cost, finished = self._act(worker)
            if cost is None:
                continue
            self._free_at[worker] = self.now + cost
            if engine.running or engine.waiting:
                self._schedule(worker)
            for job in finished:
                self._push(self.now + cost + self._rng.uniform(0, self._jitter_s), -1, job)

    def _act(self, worker: int) -> tuple[float | None, list[Job]]:
        """Run the worker's next prefill batch or decode step: its simulated seconds (None when it
        has nothing it can run) and the jobs it finished."""
        engine, config = self.engines[worker], self.config
        admitted = engine._admit()
        if admitted:
            cost = config.prefill_overhead_s + config.prefill_s_per_token * sum(
                len(r.prompt) - r.cached_tokens for r in admitted
            )
            for request in admitted:
                engine._emit_token(request)
                self._jobs[worker][id(request)].first_token = self.now + cost
        elif engine.running:
            cost = config.decode_step_s + config.decode_s_per_request * len(engine.running)
            for request in engine.running:
                engine._emit_token(request)
        else:
            return None, []
        engine.stats.busy_s += cost
        finished = [r for r in engine.running if len(r.output) >= r.max_new_tokens]
        engine._retire()
        return cost, [self._jobs[worker].pop(id(r)) for r in finished]
