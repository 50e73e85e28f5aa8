"""In-memory byte tier (L1, L2): a dict under a byte budget, an eviction policy, optional zstd."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import zstandard

from cachelayer.policies import make_policy
from cachelayer.stats import TierCounters, TierSnapshot
from cachelayer.tier import Entry

__all__ = [
    "DEFAULT_L1_BYTES",
    "DEFAULT_L2_BYTES",
    "DEFAULT_ZSTD_LEVEL",
    "ENTRY_OVERHEAD_BYTES",
    "MemoryTier",
    "MemoryTierConfig",
]

DEFAULT_L1_BYTES = 64 * 1024 * 1024
DEFAULT_L2_BYTES = 512 * 1024 * 1024
DEFAULT_ZSTD_LEVEL = 3
ENTRY_OVERHEAD_BYTES = 64
"""Bytes charged per entry on top of key and value, so a flood of tiny entries cannot dodge the budget."""
MIN_COMPRESS_BYTES = 1024
"""Smaller values are kept raw: zstd took ~10 us to shrink a 314-byte answer to 252 bytes."""


@dataclass(frozen=True, slots=True)
class MemoryTierConfig:
    """One in-memory tier."""

    name: str = "l1"
    """Name in stats and metrics."""
    capacity_bytes: int = DEFAULT_L1_BYTES
    """Budget for keys + stored (possibly compressed) values + per-entry overhead; never exceeded."""
    policy: str = "lru"
    """Eviction policy: ``lru``, ``lfu``, ``fifo`` or ``adaptive``."""
    compress: bool = False
    """zstd-compress values of ``MIN_COMPRESS_BYTES`` or more (kept raw when it does not shrink them)."""
    zstd_level: int = DEFAULT_ZSTD_LEVEL
    """zstd level when ``compress`` is on."""
    max_entries: int | None = None
    """Most entries held at once (e.g. the seed's ``l1_capacity``); None: only the byte budget limits."""


class _Slot(NamedTuple):
    entry: Entry
    """The entry as stored: the caller's own object, or a copy holding zstd-compressed bytes."""
    compressed: bool
    size: int
    """Bytes charged against the budget (key + stored data + ``ENTRY_OVERHEAD_BYTES``)."""


class MemoryTier:
    """A byte-budgeted dict; see ``MemoryTierConfig``."""

    def __init__(self, config: MemoryTierConfig, clock: Callable[[], float] = time.time) -> None:
        """Create an empty tier; ``clock`` reads wall-clock seconds (TTLs are absolute times)."""
        if config.capacity_bytes < 0:
            raise ValueError(f"{config.name}.capacity_bytes must be >= 0, got {config.capacity_bytes}")
        if config.max_entries is not None and config.max_entries < 0:
            raise ValueError(f"{config.name}.max_entries must be >= 0, got {config.max_entries}")
        self.name = config.name
        self._config = config
        self._clock = clock
        self._policy = make_policy(config.policy)
        self._capacity = config.capacity_bytes
        self._max_entries = sys.maxsize if config.max_entries is None else config.max_entries
        """The entry cap (``sys.maxsize`` when only bytes limit), read on every put."""
        self._slots: dict[bytes, _Slot] = {}
        self._bytes = 0
        self._counters = TierCounters()
        self._compressor = zstandard.ZstdCompressor(level=config.zstd_level) if config.compress else None
        self._decompressor = zstandard.ZstdDecompressor()
        self.demotes = True
        """Whether ``put`` returns what it evicts (False when no tier below takes it)."""

    def get(self, key: bytes) -> Entry | None:
        """The live entry for ``key``, or None."""
        self._counters.queries += 1
        slot = self._slots.get(key)
        if slot is not None and slot.entry.expires_at is not None and slot.entry.expires_at <= self._clock():
            self._drop(key)
            self._policy.remove(key)
            self._counters.expirations += 1
            slot = None
        if slot is None:
            self._counters.misses += 1
            return None
        self._policy.touch(key)
        self._counters.hits += 1
        return self._entry(slot)

    def contains(self, key: bytes) -> bool:
        """Whether a live entry for ``key`` is held (no query counted, no recency refreshed)."""
        slot = self._slots.get(key)
        return slot is not None and (slot.entry.expires_at is None or slot.entry.expires_at > self._clock())

    def put(self, key: bytes, entry: Entry) -> list[tuple[bytes, Entry]]:
        """Store ``entry``, evicting by policy first; returns the live entries pushed out."""
        slots = self._slots
        if key in slots:
            self._drop(key)
            self._policy.remove(key)
        stored, compressed = entry, False
        data = entry.data
        if self._compressor is not None and len(data) >= MIN_COMPRESS_BYTES:
            packed = self._compressor.compress(data)
            if len(packed) < len(data):
                stored, compressed, data = entry._replace(data=packed), True, packed
        size = len(key) + len(data) + ENTRY_OVERHEAD_BYTES
        capacity, max_entries = self._capacity, self._max_entries
        if size > capacity or max_entries == 0:
            return [(key, entry)]
        pushed_out: list[tuple[bytes, Entry]] = []
        if self._bytes + size > capacity or len(slots) >= max_entries:
            self._make_room(size, pushed_out)
        slots[key] = _Slot(stored, compressed, size)
        self._bytes += size
        self._policy.insert(key, size, entry.cost)
        self._counters.puts += 1
        return pushed_out

    def _make_room(self, size: int, pushed_out: list[tuple[bytes, Entry]]) -> None:
        """Evict by policy until ``size`` more bytes and one more entry fit; live victims go to
        ``pushed_out`` when this tier demotes."""
        now = self._clock()
        while self._bytes + size > self._capacity or len(self._slots) >= self._max_entries:
            victim = self._policy.pop_victim()
            assert victim is not None, "policy lost track of stored keys"
            slot = self._drop(victim)
            expires_at = slot.entry.expires_at
            if expires_at is not None and expires_at <= now:
                self._counters.expirations += 1
            else:
                self._counters.evictions += 1
                if self.demotes:
                    pushed_out.append((victim, self._entry(slot)))

    def delete(self, key: bytes) -> bool:
        """Drop ``key``; True when it was present."""
        if key not in self._slots:
            return False
        self._drop(key)
        self._policy.remove(key)
        return True

    def clear(self) -> None:
        """Drop every entry."""
        self._slots.clear()
        self._bytes = 0
        self._policy = make_policy(self._config.policy)

    def stats(self) -> TierSnapshot:
        """Counters and size now."""
        return self._counters.snapshot(
            name=self.name,
            kind="memory",
            policy=self._config.policy,
            size=self._bytes,
            entries=len(self._slots),
            capacity=self._config.capacity_bytes,
        )

    def close(self) -> None:
        """Nothing to release: memory goes with the object."""

    def _drop(self, key: bytes) -> _Slot:
        slot = self._slots.pop(key)
        self._bytes -= slot.size
        return slot

    def _entry(self, slot: _Slot) -> Entry:
        if not slot.compressed:
            return slot.entry
        return slot.entry._replace(data=self._decompressor.decompress(slot.entry.data))
