"""The `alerts` of `GET /v1/cache/stats`: the conditions of `deploy/prometheus/alerts.yaml` that the
gateway can see in its own state, evaluated each time the stats are read.

Each alert carries the Prometheus rule's name and severity, the `source` it is about (a worker, a
model, a tier), a message, and `since`: when this gateway first saw the condition hold (Unix
seconds), kept across reads until the condition clears. Conditions over windows of rates (the 5xx
ratio, the p99 time to first token) and the scrape itself need Prometheus' series and stay there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from cachelayer.stats import TierSnapshot
from proxy.cache.counters import CacheMonitor, TrendPoint
from proxy.routing.worker import Worker

Severity = Literal["critical", "warning", "info"]

FULL_FRACTION = 0.95
"""A tier holding this fraction of its byte budget is full (the rule's `> 0.95`)."""
RECENT_WINDOW_S = 900.0
"""The hit rate now is taken over this many seconds of trend samples (the rule's `[15m]`)."""
MIN_RECENT_LOOKUPS = 20
"""Fewer lookups than this in the recent window say nothing about the hit rate."""
COLLAPSE_FACTOR = 0.5
"""The hit rate has collapsed below this fraction of the whole trend window's rate."""
DISK_KIND = "disk"


class Alert(msgspec.Struct, kw_only=True):
    """One condition that holds now."""

    name: str
    """The alert rule's name in deploy/prometheus/alerts.yaml (its runbook: docs/operations.md)."""
    severity: Severity
    source: str
    """What it is about: a worker id, a model, or a cache tier."""
    message: str
    since: float
    """Unix seconds when this gateway first saw the condition hold."""


@dataclass(slots=True, frozen=True)
class Condition:
    name: str
    severity: Severity
    source: str
    message: str


@dataclass(slots=True)
class AlertBook:
    """Remembers since when each condition has held; a condition that clears is forgotten."""

    clock: Callable[[], float] = time.time
    _since: dict[tuple[str, str], float] = field(default_factory=dict)

    def evaluate(self, conditions: Iterable[Condition]) -> list[Alert]:
        now = self.clock()
        found = list(conditions)
        held = {(c.name, c.source) for c in found}
        self._since = {key: at for key, at in self._since.items() if key in held}
        alerts = []
        for condition in found:
            since = self._since.setdefault((condition.name, condition.source), now)
            alerts.append(
                Alert(
                    name=condition.name,
                    severity=condition.severity,
                    source=condition.source,
                    message=condition.message,
                    since=since,
                )
            )
        return alerts


def conditions(
    tiers: Iterable[TierSnapshot], workers: list[Worker], monitor: CacheMonitor
) -> list[Condition]:
    """Every condition that holds now, workers first, then the cache."""
    return [*worker_conditions(workers), *tier_conditions(tiers), *hit_rate_conditions(monitor)]


def worker_conditions(workers: list[Worker]) -> list[Condition]:
    found: list[Condition] = []
    healthy: dict[str, int] = {}
    known: set[str] = set()
    for worker in workers:
        if worker.health == "down":
            found.append(
                Condition(
                    "RadixgateWorkerDown", "warning", worker.id, "fails its health checks; gets no requests"
                )
            )
        if worker.breaker.state == "open":
            found.append(
                Condition("RadixgateBreakerOpen", "warning", worker.id, "circuit breaker open after failures")
            )
        up = worker.health == "up" and worker.breaker.state != "open" and not worker.draining
        for model in worker.models:
            healthy[model] = healthy.get(model, 0) + up
            if worker.health != "unknown":
                known.add(model)
    for model, count in sorted(healthy.items()):
        if count == 0 and model in known:  # not at start-up, before the first health check
            found.append(
                Condition(
                    "RadixgateNoHealthyWorker",
                    "critical",
                    model,
                    "no healthy worker serves it; requests get 503",
                )
            )
    return found


def tier_conditions(tiers: Iterable[TierSnapshot]) -> list[Condition]:
    found: list[Condition] = []
    for tier in tiers:
        if tier.errors:
            what = "failed calls" if tier.kind == "redis" else "corrupt or unwritable entries"
            found.append(
                Condition(
                    "RadixgateCacheTierErrors",
                    "warning",
                    tier.name,
                    f"{tier.errors} {what} so far, answered as misses",
                )
            )
        capacity = tier.capacity_bytes
        if (
            tier.kind == DISK_KIND
            and capacity
            and tier.bytes is not None
            and tier.bytes > FULL_FRACTION * capacity
        ):
            found.append(
                Condition(
                    "RadixgateDiskTierNearCapacity",
                    "info",
                    tier.name,
                    f"{tier.bytes} of {capacity} bytes held; {tier.evictions} entries evicted so far",
                )
            )
    return found


def hit_rate_conditions(monitor: CacheMonitor) -> list[Condition]:
    """The response-cache hit rate of the last `RECENT_WINDOW_S` against the whole trend window."""
    points = list(monitor.trend)
    if len(points) < 2:
        return []
    now = TrendPoint(at=monitor.clock(), lookups=monitor.total.lookups, hits=monitor.total.hits)
    recent_start = next((p for p in points if p.at >= now.at - RECENT_WINDOW_S), points[-1])
    recent_lookups = now.lookups - recent_start.lookups
    window_lookups = now.lookups - points[0].lookups
    if recent_start is points[0] or recent_lookups < MIN_RECENT_LOOKUPS or not window_lookups:
        return []
    recent = (now.hits - recent_start.hits) / recent_lookups
    window = (now.hits - points[0].hits) / window_lookups
    if recent >= COLLAPSE_FACTOR * window:
        return []
    return [
        Condition(
            "RadixgateResponseCacheHitRateCollapse",
            "warning",
            "response_cache",
            f"hit rate {recent:.0%} over the last {RECENT_WINDOW_S / 60:.0f} min, "
            f"{window:.0%} over the last {(now.at - points[0].at) / 60:.0f} min",
        )
    ]
