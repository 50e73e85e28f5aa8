"""`GET /v1/cache/stats`: the seed's document, filled from live counters only.

Rates are percentages (0-100), as in the seed. Field meanings where the seed leaves them open:

- `cache_manager.kv_cache`: the tiered store behind the response cache (radixgate's multi-level
  cache) and, when the embedded engine offloads KV pages (`--cache-dir`, `local_engine.kv_offload`),
  its page store, whose tiers are named `kv_l2` (memory) and `kv_l3` (disk). `hits`/`misses` add both
  stores' lookups (one answer, one KV page); `l1_hits`/`l2_hits`/`l3_hits` count lookups answered by
  that level of either store (`kv_l2` counts as L2, `kv_l3` as L3); `remote_hits` by Redis.
  `kv_pages` details each engine's page store (pages offloaded, loaded, skipped as slower to load
  than to recompute, rejected for another layout, and the speed estimates behind those choices).
- `cache_manager.radix_tree`: see `proxy.cache.radix_stats`.
- `speculation`: the embedded engines' speculative decoding, and SGLang's and vLLM's own figures from
  their `/metrics` (`proxy.cache.speculation_stats`), with the configured values from `[speculative]`.
- `sliding_window`: the embedded engines' sliding windows (see `proxy.cache.window_stats`; rates in
  percent) and the configured values from `[sliding_window]`.
- `overall` has no `efficiency_score`: radixgate defines no such score, and a made-up figure would
  mislead. `background_tasks_active` is true while the warm file runs (trend samples are taken on
  requests). `warming` reports the warm file's progress (`proxy.cache.warm_file`).
"""

from __future__ import annotations

from dataclasses import asdict

import msgspec

from cachelayer.admission import AdmissionGate
from cachelayer.stats import StoreSnapshot, TierSnapshot
from proxy.cache.alerts import Alert, AlertBook, conditions
from proxy.cache.config import ContextCacheConfig, SlidingWindowConfig
from proxy.cache.counters import CacheCounters, CacheMonitor
from proxy.cache.kv_pages import KvPagesStats, OffloadFigures, kv_offloads, kv_pages_stats
from proxy.cache.radix_stats import RadixTreeStats, percent, radix_stats
from proxy.cache.speculation_stats import SpeculationStats, speculation_stats
from proxy.cache.warm_file import WarmProgress
from proxy.cache.window_stats import window_totals
from proxy.routing.pool import WorkerPool

NOT_IMPLEMENTED = "radixgate does not implement this feature; the figures are zero, not measured"
WINDOW_NOTE = "the embedded engines' windows; upstream engines report none"


class TierStats(msgspec.Struct, kw_only=True):
    name: str
    kind: str
    policy: str
    queries: int
    hits: int
    misses: int
    puts: int
    evictions: int
    expirations: int
    errors: int
    bytes: int | None
    entries: int | None
    capacity_bytes: int | None


class KvCacheStats(msgspec.Struct, kw_only=True):
    contents: str = "responses"
    """`responses`, or `responses+kv_pages` when an engine's KV page store is included."""
    hits: int
    misses: int
    hit_rate: float
    memory_bytes: int
    disk_bytes: int
    evictions: int
    l1_hits: int
    l2_hits: int
    l3_hits: int
    remote_hits: int
    tiers: list[TierStats]
    kv_pages: list[KvPagesStats] = msgspec.field(default_factory=list)


class ResponseCacheStats(msgspec.Struct, kw_only=True):
    enabled: bool
    share_across_tenants: bool
    hits: int
    misses: int
    refreshes: int
    bypasses: int
    stores: int
    not_stored: int
    not_admitted: int
    admission: str
    """The admission policy (`always`, `adaptive`, `second_sighting`)."""
    admission_selective: bool
    """Whether answers are stored only on their key's second sighting now."""
    hit_rate: float


class SlidingWindowStats(msgspec.Struct, kw_only=True):
    implemented: bool = True
    note: str = WINDOW_NOTE
    hits: int = 0
    misses: int = 0
    hit_rate: float = 0.0
    memory_bytes: int = 0
    evictions: int = 0
    utilization: float = 0.0
    offloaded: int = 0
    """Kept windows saved to the engines' L2/L3 offload tiers (leaving the pool, or at shutdown)."""
    offload_hits: int = 0
    """Window hits whose kept window was loaded back from those tiers (counted in `hits` too)."""
    configured: SlidingWindowConfig


class CacheManagerStats(msgspec.Struct, kw_only=True):
    kv_cache: KvCacheStats
    response_cache: ResponseCacheStats
    radix_tree: RadixTreeStats
    speculation: SpeculationStats
    sliding_window: SlidingWindowStats


class OverallStats(msgspec.Struct, kw_only=True):
    hit_rate: float
    total_memory_bytes: int
    operations_per_second: float
    avg_response_time_us: float
    background_tasks_active: bool = False
    """True while the warm file is being run (`[cache] warm_file`)."""


class TrendSample(msgspec.Struct, kw_only=True):
    at: float
    lookups: int
    hits: int


class Trends(msgspec.Struct, kw_only=True):
    window_seconds: float
    interval_seconds: float
    data_points: int
    samples: list[TrendSample]


class WarmingStats(msgspec.Struct, kw_only=True):
    """The `[cache] warm_file` run (`proxy.cache.warm_file`)."""

    file: str
    state: str
    """`pending`, `running` or `done`."""
    items: int
    done: int
    """Items run so far, failed ones included."""
    failed: int
    cached_tokens: int
    """Prompt tokens the engines already held when the items ran."""
    started_at: float | None
    seconds: float | None
    """How long the whole run took (null until done)."""
    errors: list[str]


class CacheStatsResponse(msgspec.Struct, kw_only=True):
    """The whole `GET /v1/cache/stats` document."""

    preset: str
    cache_manager: CacheManagerStats
    overall: OverallStats
    alerts: list[Alert]
    trends: Trends
    warming: WarmingStats | None = None
    """Null when no `[cache] warm_file` is configured."""


def build_stats(
    config: ContextCacheConfig,
    preset: str,
    store: StoreSnapshot | None,
    monitor: CacheMonitor,
    router: WorkerPool,
    admission: AdmissionGate,
    alert_book: AlertBook,
    *,
    enabled: bool,
    shared: bool,
    warming: WarmProgress | None = None,
    tenant: CacheCounters | None = None,
) -> CacheStatsResponse:
    """The stats document from the store snapshot, the counters and the router's live state.

    `tenant`: the caller's own counters, for a caller who sees only its tenant's (a tenant key):
    the response cache's counters, its hit rate and admission are then that tenant's, and the
    gateway-wide lookup trend is left out; `admission` is then that tenant's gate."""
    tiers = store.tiers if store is not None else ()
    offloads = kv_offloads(router)
    every = tiers + tuple(tier for _, figures in offloads for tier in figures.store.tiers)
    radix = radix_stats(router)
    workers = router.workers()
    memory = sum(t.bytes or 0 for t in every if t.kind == "memory")
    total = tenant if tenant is not None else monitor.total
    mean_lookup = monitor.lookup_seconds / monitor.timed_lookups if monitor.timed_lookups else 0.0
    return CacheStatsResponse(
        preset=preset,
        cache_manager=CacheManagerStats(
            kv_cache=_kv_cache(store, tiers, offloads),
            response_cache=_response_cache(total, admission, enabled=enabled, shared=shared),
            radix_tree=radix,
            speculation=speculation_stats(router, config.speculative),
            sliding_window=_sliding_window(router, config.sliding_window),
        ),
        overall=OverallStats(
            hit_rate=percent(total.hit_rate),
            total_memory_bytes=memory + radix.tree_memory_bytes,
            operations_per_second=round(monitor.lookups_per_second(), 3),
            avg_response_time_us=round(mean_lookup * 1e6, 2),
            background_tasks_active=warming is not None and warming.state == "running",
        ),
        alerts=alert_book.evaluate(conditions(every, workers, monitor)),
        trends=Trends(
            window_seconds=monitor.trend_window_s,
            interval_seconds=monitor.trend_interval_s,
            data_points=0 if tenant is not None else len(monitor.trend),
            samples=[]
            if tenant is not None
            else [TrendSample(at=p.at, lookups=p.lookups, hits=p.hits) for p in monitor.trend],
        ),
        warming=WarmingStats(**asdict(warming)) if warming is not None else None,
    )


def _kv_cache(
    store: StoreSnapshot | None,
    tiers: tuple[TierSnapshot, ...],
    offloads: list[tuple[str, OffloadFigures]],
) -> KvCacheStats:
    stores = ([store] if store is not None else []) + [figures.store for _, figures in offloads]
    every = tiers + tuple(tier for _, figures in offloads for tier in figures.store.tiers)
    hits = sum(s.hits for s in stores)
    misses = sum(s.misses for s in stores)

    def level_hits(*names: str) -> int:
        return sum(t.hits for t in every if t.name in names)

    return KvCacheStats(
        contents="responses+kv_pages" if offloads else "responses",
        hits=hits,
        misses=misses,
        hit_rate=percent(hits / (hits + misses)) if hits + misses else 0.0,
        memory_bytes=sum(t.bytes or 0 for t in every if t.kind == "memory"),
        disk_bytes=sum(t.bytes or 0 for t in every if t.kind == "disk"),
        evictions=sum(t.evictions for t in every),
        l1_hits=level_hits("l1"),
        l2_hits=level_hits("l2", "kv_l2"),
        l3_hits=level_hits("l3", "kv_l3"),
        remote_hits=sum(t.hits for t in every if t.kind == "redis"),
        tiers=[TierStats(**asdict(tier)) for tier in every],
        kv_pages=[kv_pages_stats(worker, figures) for worker, figures in offloads],
    )


def _response_cache(
    total: CacheCounters, admission: AdmissionGate, *, enabled: bool, shared: bool
) -> ResponseCacheStats:
    return ResponseCacheStats(
        enabled=enabled,
        share_across_tenants=shared,
        hits=total.hits,
        misses=total.misses,
        refreshes=total.refreshes,
        bypasses=total.bypasses,
        stores=total.stores,
        not_stored=total.not_stored,
        not_admitted=total.not_admitted,
        admission=admission.policy,
        admission_selective=admission.selective,
        hit_rate=percent(total.hit_rate),
    )


def _sliding_window(router: WorkerPool, configured: SlidingWindowConfig) -> SlidingWindowStats:
    totals = window_totals(router)
    lookups = totals.hits + totals.misses
    return SlidingWindowStats(
        hits=totals.hits,
        misses=totals.misses,
        hit_rate=percent(totals.hits / lookups) if lookups else 0.0,
        memory_bytes=totals.memory_bytes,
        evictions=totals.evictions,
        utilization=percent(totals.utilization),
        offloaded=totals.offloaded,
        offload_hits=totals.offload_hits,
        configured=configured,
    )
