"""Eviction policies for the byte tiers, chosen by name: ``lru``, ``lfu``, ``fifo``, ``adaptive``.

A policy only orders keys; the tier owns the bytes. The tier reports every insert, hit and removal,
and asks ``pop_victim`` for the next key to evict when it needs room.

``adaptive`` is GreedyDual-Size-Frequency (Cherkasova, 1998). Each entry has a priority

    H(key) = L + frequency(key) * cost(key) / size(key)

and the victim is the entry with the lowest H. ``L`` is an inflation value that starts at 0 and is
raised to the H of every evicted entry, so an entry's priority is fixed when it was last touched
while ``L`` keeps growing: entries not hit for a while fall behind fresh ones (recency), entries hit
often climb by ``cost / size`` per hit (frequency), and small or expensive-to-recompute entries are
kept over large or cheap ones (size/cost). With every cost equal it prefers many small hot entries;
callers pass a real cost (e.g. prefill tokens a KV page saves) to protect large valuable entries.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import Protocol

__all__ = ["POLICY_NAMES", "EvictionPolicy", "make_policy"]

POLICY_NAMES = ("lru", "lfu", "fifo", "adaptive")


class EvictionPolicy(Protocol):
    """Orders a tier's keys for eviction."""

    def insert(self, key: bytes, size: int, cost: float) -> None:
        """A new key was stored (never one already present)."""
        ...

    def touch(self, key: bytes) -> None:
        """A stored key was read."""
        ...

    def remove(self, key: bytes) -> None:
        """A stored key was deleted or expired (not evicted)."""
        ...

    def pop_victim(self) -> bytes | None:
        """Forget and return the key to evict next, or None when empty."""
        ...


class LruPolicy:
    """Least recently inserted or read goes first."""

    def __init__(self, *, refresh_on_touch: bool = True) -> None:
        self._order: OrderedDict[bytes, None] = OrderedDict()
        self._refresh = refresh_on_touch

    def insert(self, key: bytes, size: int, cost: float) -> None:
        self._order[key] = None

    def touch(self, key: bytes) -> None:
        if self._refresh:
            self._order.move_to_end(key)

    def remove(self, key: bytes) -> None:
        self._order.pop(key, None)

    def pop_victim(self) -> bytes | None:
        return self._order.popitem(last=False)[0] if self._order else None


def _fifo() -> LruPolicy:
    """Oldest insert goes first; reads change nothing."""
    return LruPolicy(refresh_on_touch=False)


class LfuPolicy:
    """Fewest reads go first; ties go to the least recently used. O(1) per operation."""

    def __init__(self) -> None:
        self._freq: dict[bytes, int] = {}
        self._buckets: dict[int, OrderedDict[bytes, None]] = {}
        self._min = 0

    def insert(self, key: bytes, size: int, cost: float) -> None:
        self._freq[key] = 1
        self._buckets.setdefault(1, OrderedDict())[key] = None
        self._min = 1

    def touch(self, key: bytes) -> None:
        freq = self._freq[key]
        self._unlink(key, freq)
        self._freq[key] = freq + 1
        self._buckets.setdefault(freq + 1, OrderedDict())[key] = None
        if self._min == freq and freq not in self._buckets:
            self._min = freq + 1

    def remove(self, key: bytes) -> None:
        freq = self._freq.pop(key, None)
        if freq is not None:
            self._unlink(key, freq)

    def pop_victim(self) -> bytes | None:
        if not self._freq:
            return None
        if self._min not in self._buckets:  # a removal emptied the lowest bucket
            self._min = min(self._buckets)
        key = next(iter(self._buckets[self._min]))
        self.remove(key)
        return key

    def _unlink(self, key: bytes, freq: int) -> None:
        bucket = self._buckets[freq]
        del bucket[key]
        if not bucket:
            del self._buckets[freq]


class AdaptivePolicy:
    """GreedyDual-Size-Frequency: recency by aging, frequency by hit count, size and cost by ratio."""

    def __init__(self) -> None:
        self._inflation = 0.0
        self._entries: dict[bytes, tuple[float, int, float, int]] = {}  # key -> (H, freq, cost, size)
        self._heap: list[tuple[float, int, bytes]] = []  # stale entries are skipped on pop
        self._stamp: dict[bytes, int] = {}
        self._counter = itertools.count()

    def insert(self, key: bytes, size: int, cost: float) -> None:
        self._set(key, 1, cost, max(size, 1))

    def touch(self, key: bytes) -> None:
        _, freq, cost, size = self._entries[key]
        self._set(key, freq + 1, cost, size)

    def remove(self, key: bytes) -> None:
        if self._entries.pop(key, None) is not None:
            del self._stamp[key]

    def pop_victim(self) -> bytes | None:
        while self._heap:
            priority, stamp, key = heapq.heappop(self._heap)
            if self._stamp.get(key) == stamp:
                self._inflation = priority
                self.remove(key)
                return key
        return None

    def _set(self, key: bytes, freq: int, cost: float, size: int) -> None:
        priority = self._inflation + freq * cost / size
        stamp = next(self._counter)
        self._entries[key] = (priority, freq, cost, size)
        self._stamp[key] = stamp
        heapq.heappush(self._heap, (priority, stamp, key))
        if len(self._heap) > 2 * len(self._entries) + 64:  # drop stale heap entries now and then
            self._heap = [(h, self._stamp[k], k) for k, (h, _, _, _) in self._entries.items()]
            heapq.heapify(self._heap)


def make_policy(name: str) -> EvictionPolicy:
    """The policy called ``name`` (one of ``POLICY_NAMES``)."""
    if name == "lru":
        return LruPolicy()
    if name == "fifo":
        return _fifo()
    if name == "lfu":
        return LfuPolicy()
    if name == "adaptive":
        return AdaptivePolicy()
    raise ValueError(f"unknown eviction policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")
