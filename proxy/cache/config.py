"""`ContextCacheConfig`: the seed's cache configuration, its two presets, and how it maps onto the store.

Numbers from the seed (rtx-serving-api README):

    production_optimized()   L1 10,000 entries, L2 100,000 entries, 10 GB persistent, 8 GB memory,
                             beam width 8, window 1024, full monitoring
    development()            L1 1,000 entries, L2 5,000 entries, 500 MB memory, persistence
                             disabled, beam width 2, window 256

Values the seed leaves open are radixgate's choice and marked `ours` below. Mapping onto the tiered
store (`cachelayer.tiers.StoreConfig`):

- `l1_capacity` / `l2_capacity` cap the entries of the L1 / L2 memory tiers (`max_entries`);
- `max_memory_bytes` is split between L1 and L2 in proportion to those capacities (production: L1
  gets 10/110 of 8 GB, about 727 MB); neither entries nor bytes are ever exceeded;
- `persistent_bytes` is the L3 disk budget; L3 exists only when a directory is set (`[cache] dir`,
  `--cache-dir`). "Persistence disabled" in `development()` means exactly that it has no default
  directory; with `--cache-dir` it gets a 1 GB budget (ours);
- `eviction_policy` applies to every tier; `ttl_seconds` is the TTL of every stored entry.

The cache directory also holds the embedded engine's offloaded KV pages (`<dir>/kv`, see
`local_engine_config`); their budgets are `local_engine.kv_offload_*`, not `[kv_cache]`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.local.config import DEFAULT_SINK_TOKENS, LocalEngineConfig
from cachelayer.disk import DiskTierConfig
from cachelayer.memory import MemoryTierConfig
from cachelayer.remote import RedisTierConfig
from cachelayer.tiers import StoreConfig
from proxy.cache.settings import (
    CacheSettings,
    KvCacheSettings,
    MonitoringSettings,
    PresetName,
    SlidingWindowSettings,
    SpeculativeSettings,
    check_cache_settings,
)

if TYPE_CHECKING:
    from proxy.settings import Settings

RESPONSES_SUBDIR = "responses"
"""The response cache's L3 files live in `<cache dir>/responses`."""
KV_SUBDIR = "kv"
"""The embedded engine's offloaded KV pages live in `<cache dir>/kv`."""
DEFAULT_TTL_S = 3600.0
"""The seed's example `ttl_seconds`; both presets use it (ours)."""


@dataclass(frozen=True, slots=True)
class KvCacheConfig:
    """The multi-level cache (`[kv_cache]`)."""

    l1_capacity: int
    """Most entries in L1."""
    l2_capacity: int
    """Most entries in L2."""
    max_memory_bytes: int
    """Bytes of L1 and L2 together."""
    persistent_bytes: int
    """Bytes of L3 (disk), when a directory is configured."""
    eviction_policy: str
    """`lru`, `lfu`, `fifo` or `adaptive`, for every tier."""
    ttl_seconds: float | None
    """TTL of every entry; None: kept until evicted."""
    compress_l2: bool = True
    """zstd-compress L2 values."""

    @property
    def l1_bytes(self) -> int:
        """L1's share of `max_memory_bytes` (proportional to its entry capacity)."""
        return self.max_memory_bytes * self.l1_capacity // (self.l1_capacity + self.l2_capacity)

    @property
    def l2_bytes(self) -> int:
        """L2's share: the rest of `max_memory_bytes`."""
        return self.max_memory_bytes - self.l1_bytes

    def store_config(
        self, directory: Path | None, *, write_policy: str, redis: RedisTierConfig | None = None
    ) -> StoreConfig:
        """The tiered store this section describes, with L3 under `directory` when one is given."""
        policy = self.eviction_policy
        return StoreConfig(
            l1=MemoryTierConfig(
                name="l1", capacity_bytes=self.l1_bytes, policy=policy, max_entries=self.l1_capacity
            ),
            l2=MemoryTierConfig(
                name="l2",
                capacity_bytes=self.l2_bytes,
                policy=policy,
                compress=self.compress_l2,
                max_entries=self.l2_capacity,
            ),
            l3=(
                # Write-behind: a request never waits on a file write (see cachelayer/disk.py). No
                # fsync (it costs more CPU than the answer's own store): a power loss may lose the
                # newest answers, never return a wrong one.
                DiskTierConfig(
                    directory=directory,
                    capacity_bytes=self.persistent_bytes,
                    policy=policy,
                    write_behind=True,
                    fsync=False,
                )
                if directory is not None
                else None
            ),
            remote=redis,
            write_policy=write_policy,
            default_ttl_s=self.ttl_seconds,
        )


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """`[speculative]`: `enabled`, `max_draft_tokens` and `draft_sources`, where set, replace the
    embedded engine's own `local_engine.speculative`, `max_draft_tokens` and `draft_sources`
    (`local_engine_config`; None: the engine's setting); `beam_width` caps its beam searches' `n`;
    the sampling keys fill in what a `/v1/cached/*` request with `enable_speculation: true` leaves
    out (`cached_routes.split_extras`)."""

    beam_width: int
    temperature: float
    top_k: int
    top_p: float
    enabled: bool | None = None
    max_draft_tokens: int | None = None
    draft_sources: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class SlidingWindowConfig:
    """`[sliding_window]`: the embedded engine's sinks plus sliding window (`adapters.local.window`)."""

    window_size: int
    window_overlap: int
    use_flash_attention: bool
    enabled: bool = False
    """The default of requests that do not say (`enable_sliding_window`)."""
    sink_tokens: int = DEFAULT_SINK_TOKENS


@dataclass(frozen=True, slots=True)
class MonitoringConfig:
    """`[monitoring]`."""

    enabled: bool
    """Export the cache's Prometheus series and sample trends."""
    collection_interval_seconds: float
    """Seconds between two trend samples."""
    detailed_profiling: bool
    """Time every lookup and store into a histogram."""


@dataclass(frozen=True, slots=True)
class ContextCacheConfig:
    """The whole cache configuration, as the seed's `ContextCacheConfig`."""

    kv_cache: KvCacheConfig
    speculative: SpeculativeConfig
    sliding_window: SlidingWindowConfig
    monitoring: MonitoringConfig

    @classmethod
    def production_optimized(cls) -> ContextCacheConfig:
        """The seed's production preset."""
        return cls(
            kv_cache=KvCacheConfig(
                l1_capacity=10_000,
                l2_capacity=100_000,
                max_memory_bytes=8_000_000_000,
                persistent_bytes=10_000_000_000,
                eviction_policy="adaptive",  # ours: the seed's example TOML picks Adaptive
                ttl_seconds=DEFAULT_TTL_S,
            ),
            # Sampling values: the seed's example TOML (ours to reuse here).
            speculative=SpeculativeConfig(beam_width=8, temperature=0.8, top_k=40, top_p=0.9),
            sliding_window=SlidingWindowConfig(window_size=1024, window_overlap=64, use_flash_attention=True),
            monitoring=MonitoringConfig(
                enabled=True, collection_interval_seconds=30.0, detailed_profiling=True
            ),
        )

    @classmethod
    def development(cls) -> ContextCacheConfig:
        """The seed's development preset."""
        return cls(
            kv_cache=KvCacheConfig(
                l1_capacity=1_000,
                l2_capacity=5_000,
                max_memory_bytes=500_000_000,
                persistent_bytes=1_000_000_000,  # ours: only used with --cache-dir
                eviction_policy="lru",  # ours
                ttl_seconds=DEFAULT_TTL_S,
            ),
            speculative=SpeculativeConfig(beam_width=2, temperature=0.8, top_k=40, top_p=0.9),
            sliding_window=SlidingWindowConfig(window_size=256, window_overlap=64, use_flash_attention=True),
            monitoring=MonitoringConfig(
                enabled=True, collection_interval_seconds=10.0, detailed_profiling=False
            ),
        )

    @classmethod
    def preset(cls, name: PresetName) -> ContextCacheConfig:
        """`development` or `production`."""
        return cls.production_optimized() if name == "production" else cls.development()

    @classmethod
    def from_settings(
        cls,
        cache: CacheSettings,
        kv_cache: KvCacheSettings,
        speculative: SpeculativeSettings,
        sliding_window: SlidingWindowSettings,
        monitoring: MonitoringSettings,
    ) -> ContextCacheConfig:
        """The preset `cache.preset` names, with every key the sections set replacing its value.

        Raises `CacheSettingsError` naming the key when a combination is invalid.
        """
        base = cls.preset(cache.preset)
        window = _overlay(base.sliding_window, sliding_window)
        check_cache_settings(kv_cache, sliding_window, window.window_size)
        kv = _overlay(base.kv_cache, kv_cache)
        spec = _overlay(base.speculative, speculative)
        return cls(
            kv_cache=replace(kv, eviction_policy=kv.eviction_policy.lower()),
            speculative=replace(
                spec, draft_sources=tuple(spec.draft_sources) if spec.draft_sources is not None else None
            ),
            sliding_window=window,
            monitoring=_overlay(base.monitoring, monitoring),
        )

    def response_store(self, cache: CacheSettings) -> StoreConfig:
        """The response cache's store: L3 in `<cache.dir>/responses`, Redis when a URL is set."""
        directory = cache.dir.expanduser() / RESPONSES_SUBDIR if cache.dir is not None else None
        redis = (
            RedisTierConfig(url=cache.redis_url, key_prefix=cache.redis_key_prefix)
            if cache.redis_url is not None
            else None
        )
        return self.kv_cache.store_config(directory, write_policy=cache.write_policy, redis=redis)


def cache_config(settings: Settings) -> ContextCacheConfig:
    """The effective `ContextCacheConfig` of the gateway's settings; raises `CacheSettingsError`."""
    return ContextCacheConfig.from_settings(
        settings.cache, settings.kv_cache, settings.speculative, settings.sliding_window, settings.monitoring
    )


def _overlay(base: Any, section: Any) -> Any:
    """`base` with every field the TOML section set (not None) replaced."""
    changes = {
        name: value for name in section.__struct_fields__ if (value := getattr(section, name)) is not None
    }
    return replace(base, **changes)


def local_engine_config(settings: Settings) -> LocalEngineConfig:
    """The embedded engine's config: with a cache directory (`--cache-dir DIR`), KV pages the engine
    evicts (and, written behind, those it keeps) are offloaded to memory and to `DIR/kv`, unless
    `local_engine.kv_offload_dir` names another directory. `cache.shutdown_flush_s` bounds the
    engine's flush of pages to disk at shutdown; `[speculative]`'s keys, where set, replace the
    engine's own speculative decoding settings; `[sliding_window]` sets its window."""
    cache = cache_config(settings)
    spec, window = cache.speculative, cache.sliding_window
    engine = replace(
        settings.local_engine,
        kv_shutdown_flush_s=settings.cache.shutdown_flush_s,
        beam_width=spec.beam_width,
        sliding_window=window.enabled,
        window_size=window.window_size,
        window_overlap=window.window_overlap,
        window_sink_tokens=window.sink_tokens,
    )
    if spec.enabled is not None:
        engine = replace(engine, speculative=spec.enabled)
    if spec.max_draft_tokens is not None:
        engine = replace(engine, max_draft_tokens=spec.max_draft_tokens)
    if spec.draft_sources is not None:
        engine = replace(engine, draft_sources=spec.draft_sources)
    if settings.cache.dir is None or engine.kv_offload_dir is not None:
        return engine
    return replace(engine, kv_offload=True, kv_offload_dir=settings.cache.dir.expanduser() / KV_SUBDIR)
