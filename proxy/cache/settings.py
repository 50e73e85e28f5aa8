"""The cache's sections of `radixgate.toml`: `[cache]` and the seed's `[kv_cache]`, `[speculative]`,
`[sliding_window]` and `[monitoring]`.

    [cache]
    preset = "production"          # or "development" (the default)
    dir = "/var/cache/radixgate"   # L3 disk tier; `radixgate serve --cache-dir DIR` sets it
    shutdown_flush_s = 10          # at shutdown, seconds for writing what is not on disk yet
    warm_file = "warm.jsonl"       # prompts or requests run in the background after start

    [kv_cache]                     # any key left out takes the preset's value
    l1_capacity = 5000
    eviction_policy = "Adaptive"

Keys left out of `[kv_cache]`, `[speculative]`, `[sliding_window]` and `[monitoring]` are None here and
take the preset's value in `proxy.cache.config.ContextCacheConfig`. `[speculative]`'s `enabled`,
`max_draft_tokens` and `draft_sources` drive the embedded engine's speculative decoding (its sampling
keys fill what a speculating `/v1/cached/*` request leaves out); `[sliding_window]` configures the
embedded engine's sliding-window attention (`adapters.local.window`). `check_cache_settings` catches
what msgspec's per-field constraints cannot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec

from adapters.local.config import MAX_DRAFT_TOKENS
from cachelayer.admission import DEFAULT_ADMISSION, DEFAULT_MIN_HIT_RATE, AdmissionPolicy
from cachelayer.policies import POLICY_NAMES

PresetName = Literal["development", "production"]
WritePolicy = Literal["write_back", "write_through"]
"""`cachelayer.tiers.WRITE_POLICIES`."""

DEFAULT_PRESET: PresetName = "development"
DEFAULT_WRITE_POLICY: WritePolicy = "write_through"
"""Every stored answer reaches L3 at once, so it survives a restart (write-back would keep it in memory
until evicted)."""
DEFAULT_REDIS_PREFIX = "radixgate:responses:"
DEFAULT_SHUTDOWN_FLUSH_S = 10.0
"""64k tokens of SmolLM2 fp32 KV (3 GB) flushed in 8 s on the 2-core dev box
(`benchmarks/results/kv_persistence.md`); write-behind leaves far less than that at a shutdown."""

Entries = Annotated[int, msgspec.Meta(ge=1)]
Bytes = Annotated[int, msgspec.Meta(ge=1)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]
BeamWidth = Annotated[int, msgspec.Meta(ge=2, le=16)]
"""The seed's range: 2-16 beams."""
WindowSize = Annotated[int, msgspec.Meta(ge=64, le=1024)]
"""The seed's range: 64-1024 tokens."""
Probability = Annotated[float, msgspec.Meta(gt=0, le=1)]
DraftTokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_DRAFT_TOKENS)]
DraftSource = Literal["radix", "prompt"]
"""`adapters.local.config.DRAFT_SOURCES`."""


class CacheSettingsError(ValueError):
    """A cache setting that is wrong in combination with another; `key` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


class CacheSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """`[cache]`: which preset, where L3 lives, and the response cache's switches."""

    preset: PresetName = DEFAULT_PRESET
    """`development` or `production`: the budgets of `ContextCacheConfig.development()` or
    `.production_optimized()`; keys set in `[kv_cache]` etc. override single values."""
    dir: Path | None = None
    """Directory of the L3 disk tier (created if missing); None keeps the cache in memory only."""
    response_cache: bool = True
    """Serve repeated deterministic requests from the exact-match response cache."""
    share_across_tenants: bool = False
    """Let every tenant hit every other tenant's cached answers (off: each tenant has its own)."""
    write_policy: WritePolicy = DEFAULT_WRITE_POLICY
    """`write_through` (every tier at once; survives restarts) or `write_back` (demote on eviction)."""
    redis_url: str | None = None
    """`redis://host:port/db` of a Redis shared by gateway replicas; None: no Redis tier."""
    redis_key_prefix: str = DEFAULT_REDIS_PREFIX
    """Namespace of this deployment's keys in Redis (`POST /v1/cache/clear` deletes only these)."""
    admission: AdmissionPolicy = DEFAULT_ADMISSION
    """Which missed answers are stored: `always`, `second_sighting` (a key's second miss), or
    `adaptive` (always while the cache earns hits, second sighting while it does not)."""
    admission_min_hit_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = DEFAULT_MIN_HIT_RATE
    """The `adaptive` policy stores every answer while a window of lookups reaches this hit rate."""
    shutdown_flush_s: Annotated[float, msgspec.Meta(ge=0)] = DEFAULT_SHUTDOWN_FLUSH_S
    """At shutdown, seconds allowed for writing what is not on disk yet: the embedded engine's cached
    KV pages and the disk tiers' queued writes. What is left then is lost (recomputed later)."""
    warm_file: Path | None = None
    """A JSONL file of prompts or whole requests run in the background after start, as
    `POST /v1/cache/warm` would (`proxy.cache.warm_file`); None: no warming at start."""


class KvCacheSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """`[kv_cache]` (the seed's multi-level cache), mapped onto the tiered store's L1/L2/L3."""

    l1_capacity: Entries | None = None
    """Most entries in L1 (hot, uncompressed memory)."""
    l2_capacity: Entries | None = None
    """Most entries in L2 (larger, zstd-compressed memory)."""
    max_memory_bytes: Bytes | None = None
    """Bytes L1 and L2 may hold together, split between them in proportion to their capacities."""
    persistent_bytes: Bytes | None = None
    """Bytes the L3 disk tier may hold (when a `[cache] dir` is set)."""
    eviction_policy: str | None = None
    """`lru`, `lfu`, `fifo` or `adaptive` (case-insensitive; the seed writes `Adaptive`)."""
    ttl_seconds: PositiveSeconds | None = None
    """Seconds a cached entry lives."""
    compress_l2: bool | None = None
    """zstd-compress L2 values."""


class SpeculativeSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """`[speculative]`: the embedded engine's speculative decoding, reported in `/v1/cache/stats`."""

    enabled: bool | None = None
    """Speculate for requests that do not say (`enable_speculation` on `/v1/cached/*` overrides it)."""
    max_draft_tokens: DraftTokens | None = None
    """Most draft tokens one sequence verifies in one step."""
    draft_sources: list[DraftSource] | None = None
    """`radix` (continuations earlier requests left in the prefix cache) and/or `prompt` (prompt
    lookup in the request's own tokens); empty: no drafts."""
    beam_width: BeamWidth | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    top_p: Probability | None = None


class SlidingWindowSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """`[sliding_window]`: the embedded engine's sliding-window attention with attention sinks."""

    enabled: bool | None = None
    """Requests that do not say (`enable_sliding_window`) attend with the window; default false."""
    sink_tokens: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    """First tokens every windowed token attends to (StreamingLLM's sinks); default 4."""
    window_size: WindowSize | None = None
    window_overlap: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Tokens two windows share; must be smaller than `window_size`."""
    use_flash_attention: bool | None = None


class MonitoringSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """`[monitoring]`: the cache's Prometheus series and the trend samples of `/v1/cache/stats`."""

    enabled: bool | None = None
    """Export the cache's series on `/metrics` and sample trends."""
    collection_interval_seconds: PositiveSeconds | None = None
    """Seconds between two trend samples."""
    detailed_profiling: bool | None = None
    """Also time every cache lookup and store into `radixgate_cache_operation_seconds`."""


def check_cache_settings(
    kv_cache: KvCacheSettings, sliding_window: SlidingWindowSettings, window_size: int
) -> None:
    """Raise `CacheSettingsError` for values msgspec's per-field checks let through.

    `window_size` is the effective one (the preset's when `[sliding_window]` does not set it).
    """
    policy = kv_cache.eviction_policy
    if policy is not None and policy.lower() not in POLICY_NAMES:
        raise CacheSettingsError(
            "kv_cache.eviction_policy", f"expected one of {', '.join(POLICY_NAMES)}, got {policy!r}"
        )
    if sliding_window.use_flash_attention is False:
        raise CacheSettingsError(
            "sliding_window.use_flash_attention",
            "attention is always blockwise (flash); false is not supported",
        )
    overlap = sliding_window.window_overlap
    if overlap is not None and overlap >= window_size:
        raise CacheSettingsError(
            "sliding_window.window_overlap",
            f"must be smaller than window_size ({window_size}), got {overlap}",
        )
