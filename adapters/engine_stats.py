"""Latency histograms an in-process engine keeps on its own thread and publishes as snapshots.

The embedded engine observes queue time (submission to first admission) and inter-token latency
(the gap between two tokens of one sequence) on its engine thread with `LatencyHistogram`, and puts
`LatencyFigures` (an immutable copy) into each stats snapshot, which the gateway's Prometheus
collector reads from the event loop. No lock: only the engine thread writes, and a snapshot is
never changed after it is made. No torch here, so the gateway imports it without the engine.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

QUEUE_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
"""Seconds a request waits before its first admission (vLLM's request_queue_time_seconds spans these)."""
INTER_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5)
"""Seconds between two tokens of one sequence, a CPU engine's decode step included."""


@dataclass(slots=True, frozen=True)
class LatencyFigures:
    """A histogram's state at one moment: per-bucket counts (the last one is +Inf), sum and count."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """`(le, count of samples <= le)` pairs, +Inf last: Prometheus' bucket form."""
        running = 0
        pairs = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            pairs.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
        return pairs


class LatencyHistogram:
    """Fixed buckets; `observe` from one thread only, `figures()` for a snapshot."""

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect_left(self._bounds, seconds)] += 1
        self._sum += seconds

    def figures(self) -> LatencyFigures:
        return LatencyFigures(self._bounds, tuple(self._counts), self._sum)
