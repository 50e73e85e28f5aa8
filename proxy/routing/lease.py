"""One attempt's hold on one worker: `PoolLease.release` uncharges the worker, feeds its breaker,
learns a byte-routed model's bytes per token, corrects the tree with the engine's `cached_tokens`
and ends the decision's span with it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.trace import Span

from adapters.schema import Usage
from proxy.routing.worker import InFlight, Worker

if TYPE_CHECKING:
    from proxy.routing.pool import WorkerPool


@dataclass(slots=True, frozen=True)
class RoutedPrompt:
    """What a lease needs to learn a byte-routed model's bytes per token from the engine's usage."""

    model: str
    kind: str
    units: int
    """Prompt length in the tree's keys, the tenant salt's pseudo-token excluded."""


class PoolLease:
    """One attempt's hold on one worker (`proxy.router.WorkerLease`)."""

    __slots__ = (
        "_charge",
        "_panic",
        "_pool",
        "_predicted",
        "_prompt_tokens",
        "_released",
        "_routed",
        "_span",
        "_worker",
        "engine",
        "worker_id",
    )

    def __init__(
        self,
        pool: WorkerPool,
        worker: Worker,
        charge: InFlight,
        prompt_tokens: float,
        predicted: int,
        routed: RoutedPrompt | None = None,
        *,
        panic: bool = False,
        span: Span | None = None,
    ):
        self._pool = pool
        self._panic = panic
        self._span = span
        self._worker = worker
        self._charge = charge
        self._prompt_tokens = prompt_tokens
        self._predicted = predicted
        self._routed = routed
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
        predicted: int | None = None
        cached = usage.cached_tokens if usage is not None and not failed else None
        if failed:
            self._pool.observer.failed(worker.id)
        elif self._panic:
            self._pool.recheck_soon(worker)  # it answered: let a health check bring it back now
        elif usage is not None and usage.prompt_tokens and self._prompt_tokens:
            routed = self._routed
            if routed is not None and routed.kind == "bytes":
                worker.learn_bytes_per_token(routed.model, routed.units, usage.prompt_tokens)
        if cached is not None and usage is not None and usage.prompt_tokens and self._prompt_tokens:
            # The prediction as a fraction of the router's estimate of the prompt, in the engine's
            # tokens (the estimate of a byte-routed prompt need not be exact).
            predicted = round(self._predicted / self._prompt_tokens * usage.prompt_tokens)
            worker.correct(usage.prompt_tokens, predicted, cached)
        self._pool.observer.settled(self._span, worker.id, predicted, cached, failed=failed)
        if worker.draining and worker.in_flight == 0:
            self._pool.finish_drain(worker)
