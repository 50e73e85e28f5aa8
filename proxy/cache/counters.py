"""Live counters of the response cache: per tenant and in total, lookup timings, and trend samples.

Updated on the event loop by `ResponseCacheStep`; read by `/v1/cache/stats`, the cached endpoints'
`cache_stats` and the Prometheus collector. Trend samples are taken lazily: the first request after
each `interval_s` appends one (so an idle gateway records no points; nothing runs in the background).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from prometheus_client import Histogram

CounterName = Literal["hits", "misses", "refreshes", "bypasses", "stores", "not_stored", "not_admitted"]

DEFAULT_TREND_WINDOW_S = 3600.0
"""Trend samples older than this are dropped (the seed reports a one-hour window)."""
DEFAULT_TREND_INTERVAL_S = 30.0


@dataclass(slots=True)
class CacheCounters:
    """Requests as the response cache saw them."""

    hits: int = 0
    """Answered from the cache."""
    misses: int = 0
    """Looked up, not found, forwarded."""
    refreshes: int = 0
    """`Cache-Control: no-cache`: forwarded without a lookup, stored again."""
    bypasses: int = 0
    """The cache took no part (off, sampled request, `no-store`, `enable_caching: false`)."""
    stores: int = 0
    """Answers stored."""
    not_stored: int = 0
    """Answers not stored because they failed, were cut short, or were incomplete."""
    not_admitted: int = 0
    """Misses whose answer the admission gate left unstored (`cachelayer.admission`)."""

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        """Hits per lookup, 0..1 (0 before the first lookup)."""
        return self.hits / self.lookups if self.lookups else 0.0

    def copy(self) -> CacheCounters:
        return replace(self)


@dataclass(slots=True, frozen=True)
class TrendPoint:
    """Totals at one moment."""

    at: float
    """Wall-clock seconds since the epoch."""
    lookups: int
    hits: int


@dataclass(slots=True)
class CacheMonitor:
    """Counters, timings and trend samples of one gateway's response cache."""

    total: CacheCounters = field(default_factory=CacheCounters)
    tenants: dict[str, CacheCounters] = field(default_factory=dict)
    """Per tenant id (bounded by the configured tenants)."""
    lookup_seconds: float = 0.0
    """Sum of the time spent in lookups (divide by `timed_lookups` for the mean)."""
    timed_lookups: int = 0
    trend_interval_s: float = DEFAULT_TREND_INTERVAL_S
    trend_window_s: float = DEFAULT_TREND_WINDOW_S
    sample_trends: bool = True
    profile: Histogram | None = None
    """`radixgate_cache_operation_seconds{operation}` when detailed profiling is on."""
    hit_seconds: Histogram | None = None
    """`radixgate_response_cache_hit_seconds` when the gateway exports metrics."""
    trend: deque[TrendPoint] = field(default_factory=deque)
    clock: Callable[[], float] = time.time
    _next_sample: float = 0.0
    _profile_series: dict[str, Histogram] = field(default_factory=dict)

    def tenant(self, tenant_id: str) -> CacheCounters:
        """The counters of one tenant (created on first use)."""
        counters = self.tenants.get(tenant_id)
        if counters is None:
            counters = self.tenants[tenant_id] = CacheCounters()
        return counters

    def count(self, tenant: CacheCounters, name: CounterName) -> None:
        """Add one to `name` for `tenant` and in total; take a trend sample when one is due."""
        setattr(tenant, name, getattr(tenant, name) + 1)
        setattr(self.total, name, getattr(self.total, name) + 1)
        if self.sample_trends:
            now = self.clock()
            if now >= self._next_sample:
                self.sample(now)

    def sample(self, now: float) -> None:
        """Append a trend point at `now` and drop points older than the window."""
        self.trend.append(TrendPoint(at=now, lookups=self.total.lookups, hits=self.total.hits))
        while self.trend and self.trend[0].at < now - self.trend_window_s:
            self.trend.popleft()
        self._next_sample = now + self.trend_interval_s

    def lookup_done(self, seconds: float) -> None:
        self.lookup_seconds += seconds
        self.timed_lookups += 1
        if self.profile is not None:
            self._operation("lookup").observe(seconds)

    def store_done(self, seconds: float) -> None:
        if self.profile is not None:
            self._operation("store").observe(seconds)

    def _operation(self, operation: str) -> Histogram:
        """The profile's series for `operation`, labelled once (`labels()` locks on every call)."""
        series = self._profile_series.get(operation)
        if series is None:
            assert self.profile is not None
            series = self._profile_series[operation] = self.profile.labels(operation)
        return series

    def lookups_per_second(self) -> float:
        """Lookups per second between the oldest trend point and now (0 with no points)."""
        if not self.trend:
            return 0.0
        first = self.trend[0]
        elapsed = self.clock() - first.at
        return (self.total.lookups - first.lookups) / elapsed if elapsed > 0 else 0.0
