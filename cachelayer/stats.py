"""Live counters of the byte tiers, read as immutable snapshots (for ``/v1/cache/stats`` and Prometheus)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StoreSnapshot", "TierCounters", "TierSnapshot"]


@dataclass(frozen=True, slots=True)
class TierSnapshot:
    """One tier's counters at one moment."""

    name: str
    """Tier name from config (``l1``, ``l2``, ``l3``, ``redis``)."""
    kind: str
    """``memory``, ``disk`` or ``redis``."""
    policy: str
    """Eviction policy name (``redis`` tiers report the server's own, as ``server``)."""
    queries: int
    """Lookups that reached this tier."""
    hits: int
    misses: int
    puts: int
    """Values written into this tier (stores, promotions and demotions)."""
    evictions: int
    """Entries pushed out to make room (not deletes, not expirations)."""
    expirations: int
    """Entries found past their TTL and dropped."""
    errors: int
    """Corrupt files removed, or remote calls that failed and were answered as misses."""
    bytes: int | None
    """Bytes held (None where the tier cannot know cheaply, e.g. a shared Redis)."""
    entries: int | None
    capacity_bytes: int | None
    """Byte budget (None when the tier has none of its own)."""

    @property
    def hit_rate(self) -> float:
        """Hits per query (0.0 before the first query)."""
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """A whole tiered store: one ``get`` is one query, a hit in any tier is a hit."""

    queries: int
    hits: int
    misses: int
    tiers: tuple[TierSnapshot, ...]

    @property
    def hit_rate(self) -> float:
        """Hits per query (0.0 before the first query)."""
        return self.hits / self.queries if self.queries else 0.0


@dataclass(slots=True)
class TierCounters:
    """Mutable counters a tier updates under its owner's lock."""

    queries: int = 0
    hits: int = 0
    misses: int = 0
    puts: int = 0
    evictions: int = 0
    expirations: int = 0
    errors: int = 0

    def snapshot(
        self,
        *,
        name: str,
        kind: str,
        policy: str,
        size: int | None,
        entries: int | None,
        capacity: int | None,
    ) -> TierSnapshot:
        """Freeze the counters together with the tier's current size."""
        return TierSnapshot(
            name=name,
            kind=kind,
            policy=policy,
            queries=self.queries,
            hits=self.hits,
            misses=self.misses,
            puts=self.puts,
            evictions=self.evictions,
            expirations=self.expirations,
            errors=self.errors,
            bytes=size,
            entries=entries,
            capacity_bytes=capacity,
        )
