"""The cache's Prometheus series, read from live snapshots when `/metrics` is scraped.

    radixgate_cache_queries_total{tier}          lookups that reached the tier
    radixgate_cache_hits_total{tier}             lookups the tier answered
    radixgate_cache_evictions_total{tier}        entries pushed out to make room
    radixgate_cache_expirations_total{tier}      entries dropped past their TTL
    radixgate_cache_errors_total{tier}           corrupt files removed, failed Redis calls
    radixgate_cache_bytes{tier}                  bytes held (memory and disk tiers)
    radixgate_cache_entries{tier}                entries held
    radixgate_cache_capacity_bytes{tier}         byte budget
    radixgate_response_cache_requests_total{outcome}   hit, miss, refresh, bypass
    radixgate_response_cache_stores_total{result}      stored, not_stored
    radixgate_cache_radix_tree_tokens{worker,tree}     tokens in each routing tree (tree="router")
                                                       and engine radix cache (tree="engine")
    radixgate_cache_operation_seconds{operation}       lookup/store time (detailed profiling only)
    radixgate_response_cache_hit_seconds               a hit answered: lookup and replay, by the step

The counters are the tiers' own, so nothing is counted twice on the request path. The embedded
engine's store of offloaded KV pages adds its tiers as `tier="kv_l2"` (memory) and `tier="kv_l3"` (disk).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from cachelayer.stats import StoreSnapshot
from proxy.cache.counters import CacheMonitor
from proxy.cache.kv_pages import kv_offloads
from proxy.cache.radix_stats import radix_stats
from proxy.routing.pool import WorkerPool
from proxy.telemetry.prometheus import METRIC_PREFIX, MetricsRegistry

OPERATION_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.25)
"""Seconds; a memory lookup takes microseconds, a disk write with fsync milliseconds."""

_TIER_COUNTERS = (
    ("cache_queries", "Cache lookups that reached the tier.", "queries"),
    ("cache_hits", "Cache lookups the tier answered.", "hits"),
    ("cache_evictions", "Cache entries the tier pushed out to make room.", "evictions"),
    ("cache_expirations", "Cache entries the tier dropped past their TTL.", "expirations"),
    ("cache_errors", "Corrupt cache files removed or failed Redis calls, answered as misses.", "errors"),
)
_TIER_GAUGES = (
    ("cache_bytes", "Bytes the cache tier holds.", "bytes"),
    ("cache_entries", "Entries the cache tier holds.", "entries"),
    ("cache_capacity_bytes", "Byte budget of the cache tier.", "capacity_bytes"),
)


class CacheCollector:
    """A prometheus_client collector over the store, the counters and the router."""

    def __init__(
        self, store_stats: Callable[[], StoreSnapshot | None], monitor: CacheMonitor, router: WorkerPool
    ) -> None:
        self._store_stats = store_stats
        self._monitor = monitor
        self._router = router

    def collect(self) -> Iterator[Metric]:
        snapshot = self._store_stats()
        tiers = snapshot.tiers if snapshot is not None else ()
        tiers += tuple(tier for _, figures in kv_offloads(self._router) for tier in figures.store.tiers)
        for name, documentation, attribute in _TIER_COUNTERS:
            counter = CounterMetricFamily(METRIC_PREFIX + name, documentation, labels=["tier"])
            for tier in tiers:
                counter.add_metric([tier.name], float(getattr(tier, attribute)))
            yield counter
        for name, documentation, attribute in _TIER_GAUGES:
            gauge = GaugeMetricFamily(METRIC_PREFIX + name, documentation, labels=["tier"])
            for tier in tiers:
                value = getattr(tier, attribute)
                if value is not None:
                    gauge.add_metric([tier.name], float(value))
            yield gauge
        total = self._monitor.total
        requests = CounterMetricFamily(
            METRIC_PREFIX + "response_cache_requests",
            "Generation requests by response-cache outcome.",
            labels=["outcome"],
        )
        for outcome, value in (
            ("hit", total.hits),
            ("miss", total.misses),
            ("refresh", total.refreshes),
            ("bypass", total.bypasses),
        ):
            requests.add_metric([outcome], float(value))
        yield requests
        stores = CounterMetricFamily(
            METRIC_PREFIX + "response_cache_stores",
            "Answers stored in the response cache, or not (failed, cut short, incomplete; not admitted).",
            labels=["result"],
        )
        stores.add_metric(["stored"], float(total.stores))
        stores.add_metric(["not_stored"], float(total.not_stored))
        stores.add_metric(["not_admitted"], float(total.not_admitted))
        yield stores
        radix = radix_stats(self._router)
        tokens = GaugeMetricFamily(
            METRIC_PREFIX + "cache_radix_tree_tokens",
            "Tokens in each routing tree (tree=router) and engine radix cache (tree=engine).",
            labels=["worker", "tree"],
        )
        for worker in radix.workers:
            tokens.add_metric([worker.worker, "router"], float(worker.tree_tokens))
        for engine in radix.engines:
            tokens.add_metric([engine.worker, "engine"], float(engine.cached_tokens))
        yield tokens


HIT_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5)
"""Seconds; a hit from memory is answered in tens of microseconds, one from disk or Redis in ms."""


def hit_histogram(registry: MetricsRegistry) -> Histogram:
    """Seconds per response-cache hit, from the lookup to the replay's last byte."""
    return registry.histogram(
        "response_cache_hit_seconds", "Seconds to answer a response-cache hit.", buckets=HIT_BUCKETS
    )


def register(
    registry: MetricsRegistry,
    store_stats: Callable[[], StoreSnapshot | None],
    monitor: CacheMonitor,
    router: WorkerPool,
    *,
    detailed_profiling: bool,
) -> Histogram | None:
    """Add the collector; with detailed profiling also return the operation-time histogram."""
    registry.add_collector(CacheCollector(store_stats, monitor, router))
    if not detailed_profiling:
        return None
    return registry.histogram(
        "cache_operation_seconds",
        "Seconds per response-cache operation.",
        ["operation"],
        buckets=OPERATION_BUCKETS,
    )
