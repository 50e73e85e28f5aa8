"""The tiered byte store: L1 and L2 in memory, L3 on disk, optionally Redis last, behind one interface.

``get`` looks in each tier in order and copies a hit into every tier above the one that had it
(promotion). ``put`` follows the configured write policy:

- ``write_back``: the value goes into L1 only; whatever a tier pushes out to make room (or cannot
  hold at all) is written into the next tier down (demotion), and so on to the last tier, whose
  evictions are dropped.
- ``write_through``: the value goes into every tier at once; evictions are simply dropped.

The Redis tier, when configured, is the last level; with ``share_on_put`` every ``put`` also reaches
it at once so other replicas see the value, whatever the write policy.

Keys are bytes from ``cachelayer.keys``. Thread-safe: one lock serialises every call, including
disk I/O. A caller on an event loop asks ``get_blocks(key)`` and ``puts_block`` whether a call may
wait on I/O and runs only those in a worker thread: a miss that no tier's index knows, or a put
whose disk write is queued for the L3 writer thread (``write_behind``), runs in microseconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cachelayer.disk import DiskTier, DiskTierConfig
from cachelayer.memory import DEFAULT_L2_BYTES, MemoryTier, MemoryTierConfig
from cachelayer.remote import RedisTier, RedisTierConfig
from cachelayer.stats import StoreSnapshot
from cachelayer.tier import DEFAULT_COST, Entry, Tier

__all__ = ["DEFAULT_WRITE_POLICY", "WRITE_POLICIES", "StoreConfig", "TieredStore"]

WRITE_POLICIES = ("write_back", "write_through")
DEFAULT_WRITE_POLICY = "write_back"


def _default_l1() -> MemoryTierConfig:
    return MemoryTierConfig(name="l1")


def _default_l2() -> MemoryTierConfig:
    return MemoryTierConfig(name="l2", capacity_bytes=DEFAULT_L2_BYTES, compress=True)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Which tiers exist and how values move between them."""

    l1: MemoryTierConfig | None = field(default_factory=_default_l1)
    """Small, hot, uncompressed memory tier (None to skip)."""
    l2: MemoryTierConfig | None = field(default_factory=_default_l2)
    """Larger memory tier, zstd-compressed by default (None to skip)."""
    l3: DiskTierConfig | None = None
    """Disk tier (off unless a directory is configured)."""
    remote: RedisTierConfig | None = None
    """Redis tier (off unless a URL is configured)."""
    write_policy: str = DEFAULT_WRITE_POLICY
    """``write_back`` (demote on eviction) or ``write_through`` (write every tier at once)."""
    default_ttl_s: float | None = None
    """TTL for values stored without one; None keeps them until evicted."""


class TieredStore:
    """See the module docstring."""

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        remote: RedisTier | None = None,
        write_policy: str = DEFAULT_WRITE_POLICY,
        default_ttl_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Stack ``tiers`` (fastest first) above an optional ``remote`` tier."""
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"unknown write_policy {write_policy!r}; expected one of {', '.join(WRITE_POLICIES)}"
            )
        if default_ttl_s is not None and default_ttl_s <= 0:
            raise ValueError(f"default_ttl_s must be > 0, got {default_ttl_s}")
        self._levels: list[Tier] = [*tiers, *([remote] if remote is not None else [])]
        self._remote = remote
        self._share = remote if remote is not None and remote.config.share_on_put else None
        self._write_back = write_policy == "write_back"
        self._default_ttl = default_ttl_s
        self._clock = clock
        self._lock = threading.RLock()
        self._queries = 0
        self._hits = 0
        self._io_levels = [level for level in self._levels if not isinstance(level, MemoryTier)]
        self._below_first = [level for level in self._levels[1:] if level is not remote]
        """Tiers a write-back ``put`` clears of an older value (Redis keeps it: other replicas share it)."""
        for level in self._levels:  # a tier hands back what it evicts only when a tier below takes it
            level.demotes = self._write_back and level is not self._levels[-1]
        self.puts_block = remote is not None or any(
            isinstance(level, DiskTier) and not level.writes_behind for level in self._levels
        )
        """Whether ``put`` may wait on I/O (Redis, or a disk tier writing inside the call)."""

    @classmethod
    def from_config(cls, config: StoreConfig, clock: Callable[[], float] = time.time) -> TieredStore:
        """Build the tiers ``config`` names (opens the L3 directory; Redis connects lazily)."""
        tiers: list[Tier] = []
        for memory in (config.l1, config.l2):
            if memory is not None:
                tiers.append(MemoryTier(memory, clock))
        if config.l3 is not None:
            tiers.append(DiskTier(config.l3, clock))
        remote = RedisTier(config.remote, clock) if config.remote is not None else None
        return cls(
            tiers,
            remote=remote,
            write_policy=config.write_policy,
            default_ttl_s=config.default_ttl_s,
            clock=clock,
        )

    @property
    def tier_names(self) -> list[str]:
        """Tier names, fastest first."""
        return [level.name for level in self._levels]

    def get(self, key: bytes) -> bytes | None:
        """The value for ``key`` from the fastest tier that has it (promoting it upwards), or None."""
        with self._lock:
            self._queries += 1
            for depth, level in enumerate(self._levels):
                entry = level.get(key)
                if entry is None:
                    continue
                self._hits += 1
                for upper in range(depth):
                    self._store_at(upper, key, entry)
                return entry.data
            return None

    def get_blocks(self, key: bytes) -> bool:
        """Whether ``get(key)`` may wait on I/O: Redis is configured, or only a disk tier holds it."""
        if self._remote is not None:
            return True
        with self._lock:
            return any(level.contains(key) for level in self._io_levels) and not any(
                level.contains(key) for level in self._levels if isinstance(level, MemoryTier)
            )

    def locate(self, key: bytes) -> str | None:
        """Name of the fastest tier holding ``key``, without reading or promoting it (None if absent).

        Lets a caller weigh loading against recomputing (e.g. a KV page on disk vs. a prefill).
        """
        with self._lock:
            return next((level.name for level in self._levels if level.contains(key)), None)

    def put(
        self, key: bytes, value: bytes, *, ttl_s: float | None = None, cost: float = DEFAULT_COST
    ) -> None:
        """Store ``value`` under ``key`` for ``ttl_s`` seconds (default: the store's) per the write policy.

        ``cost`` is what recomputing the value would take (read by the ``adaptive`` policy).
        """
        ttl = self._default_ttl if ttl_s is None else ttl_s
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl}")
        entry = Entry(value, None if ttl is None else self._clock() + ttl, cost)
        with self._lock:
            if self._write_back:
                for lower in self._below_first:  # an older value below would resurface once L1 drops this
                    lower.delete(key)
                self._store_at(0, key, entry)
                if self._share is not None and self._share is not self._levels[0]:
                    self._share.put(key, entry)
            else:
                for level in self._levels:
                    level.put(key, entry)

    def put_into(self, name: str, key: bytes, value: bytes, *, cost: float = DEFAULT_COST) -> bool:
        """Store ``value`` in the tier named ``name`` only, with no TTL; False when that tier refused it.

        For a value whose original lives elsewhere (a KV page still in the engine's pool, written
        to disk so that it outlives the process), where a copy in the memory tiers would be waste.
        """
        entry = Entry(value, None, cost)
        with self._lock:
            level = next(level for level in self._levels if level.name == name)
            return all(out_key != key for out_key, _ in level.put(key, entry))

    def delete(self, key: bytes) -> bool:
        """Remove ``key`` from every tier; True when any tier had it."""
        with self._lock:
            return any([level.delete(key) for level in self._levels])

    def clear(self) -> None:
        """Empty every tier (on Redis, only this deployment's key prefix)."""
        with self._lock:
            for level in self._levels:
                level.clear()

    def stats(self) -> StoreSnapshot:
        """Store-wide and per-tier counters now."""
        with self._lock:
            return StoreSnapshot(
                queries=self._queries,
                hits=self._hits,
                misses=self._queries - self._hits,
                tiers=tuple(level.stats() for level in self._levels),
            )

    def close(self, deadline: float | None = None) -> None:
        """Release every tier's files, locks and connections; a disk tier's queued writes are
        finished first, those not landed when ``time.monotonic()`` reaches ``deadline`` dropped."""
        with self._lock:
            for level in self._levels:
                if isinstance(level, DiskTier):
                    level.close(deadline)
                else:
                    level.close()

    def _store_at(self, depth: int, key: bytes, entry: Entry) -> None:
        """Put into tier ``depth``; under write-back, cascade what it pushes out down the tiers."""
        levels = self._levels
        pending = levels[depth].put(key, entry)
        if not pending or not self._write_back:
            return
        for level in levels[depth + 1 :]:
            pushed: list[tuple[bytes, Entry]] = []
            for out_key, out_entry in pending:
                pushed += level.put(out_key, out_entry)
            if not pushed:
                return
            pending = pushed
