"""Which requests the response cache works for: an admission gate in front of key, lookup and store.

A cacheable request costs the gateway CPU on the cache's account: its canonical key, a lookup and,
on a miss, a store (encode, insert, evict; measured in ``benchmarks/RESULTS.md``). When no request
ever repeats, all of that buys nothing. The gate sees each cacheable request's raw body first:

- ``always``: every request takes the cache's full path, and every complete answer is stored.
- ``second_sighting``: only the answer of a body the *doorkeeper* has seen is stored; a body seen
  for the first time is remembered, as a tag in a bounded set that is cleared when full (TinyLFU's
  doorkeeper), and its answer is not stored. Every request is still looked up: admission decides
  what is stored, never what is read, so an entry stored earlier (or by an earlier process, on
  disk) is found on its first sighting too. A repeated request is stored on its second sighting
  and hit from its third.
- ``adaptive`` (the default): ``always`` while the cache earns hits, ``second_sighting`` while it
  does not. Every ``window_lookups`` cacheable requests, the hit rate of that window is compared with
  ``min_hit_rate``; below it the gate turns selective, and a window at or above it turns it back.
  A fresh gateway starts in ``always``, so a repeated request hits from its second sighting until a
  whole window of traffic has shown that nothing repeats.

The price of the selective mode: a request is recognised by its exact bytes there, so a differently
written but equivalent request is one more miss before it is stored. For traffic that never
repeats, the cache then costs a key, a lookup and a set insert, but no store (encode, insert, evict).
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ADMISSION_POLICIES",
    "DEFAULT_ADMISSION",
    "DEFAULT_DOORKEEPER_KEYS",
    "DEFAULT_MIN_HIT_RATE",
    "DEFAULT_WINDOW_LOOKUPS",
    "AdmissionGate",
    "AdmissionPolicy",
]

AdmissionPolicy = Literal["always", "adaptive", "second_sighting"]
ADMISSION_POLICIES: tuple[AdmissionPolicy, ...] = ("always", "adaptive", "second_sighting")
DEFAULT_ADMISSION: AdmissionPolicy = "adaptive"
DEFAULT_WINDOW_LOOKUPS = 1024
"""Cacheable requests per hit-rate window of the ``adaptive`` policy."""
DEFAULT_MIN_HIT_RATE = 0.01
"""Hit rate a window must reach for the ``adaptive`` policy to store answers on first sighting."""
DEFAULT_DOORKEEPER_KEYS = 1 << 16
"""Key tags the doorkeeper holds before it starts over (~4 MB of set and ints)."""


class AdmissionGate:
    """See the module docstring. Not thread-safe: the event loop owns it."""

    __slots__ = ("_hits", "_lookups", "_min_hit_rate", "_seen", "_window", "capacity", "policy", "selective")

    def __init__(
        self,
        policy: AdmissionPolicy = DEFAULT_ADMISSION,
        *,
        window_lookups: int = DEFAULT_WINDOW_LOOKUPS,
        min_hit_rate: float = DEFAULT_MIN_HIT_RATE,
        doorkeeper_keys: int = DEFAULT_DOORKEEPER_KEYS,
    ) -> None:
        if policy not in ADMISSION_POLICIES:
            raise ValueError(
                f"unknown admission policy {policy!r}; expected one of {', '.join(ADMISSION_POLICIES)}"
            )
        if window_lookups < 1 or doorkeeper_keys < 1 or not 0 <= min_hit_rate <= 1:
            raise ValueError("window_lookups and doorkeeper_keys must be >= 1, min_hit_rate within 0..1")
        self.policy = policy
        self.capacity = doorkeeper_keys
        self.selective = policy == "second_sighting"
        """Whether a miss is stored only on its key's second sighting (now)."""
        self._window = window_lookups
        self._min_hit_rate = min_hit_rate
        self._lookups = 0
        self._hits = 0
        self._seen: set[int] = set()

    def fresh(self) -> AdmissionGate:
        """A new gate with this one's settings and none of its history (one per tenant)."""
        return AdmissionGate(
            self.policy,
            window_lookups=self._window,
            min_hit_rate=self._min_hit_rate,
            doorkeeper_keys=self.capacity,
        )

    def observe(self, hit: bool) -> None:
        """Count one cacheable request (hit or not); at a window's end ``adaptive`` picks its mode."""
        if self.policy != "adaptive":
            return
        self._lookups += 1
        self._hits += hit
        if self._lookups >= self._window:
            selective = self._hits < self._min_hit_rate * self._lookups
            if selective and not self.selective:
                self._seen.clear()  # tags left from an earlier selective period
            self.selective = selective
            self._lookups = self._hits = 0

    def admit(self, body: bytes) -> bool:
        """Whether the answer of the request with raw ``body`` is stored on a miss; a first sighting
        in the selective mode is remembered instead."""
        if not self.selective:
            return True
        tag = hash(body)
        seen = self._seen
        if tag in seen:  # kept: every later sighting takes the full path too (and hits)
            return True
        if len(seen) >= self.capacity:
            seen.clear()
        seen.add(tag)
        return False
