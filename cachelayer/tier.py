"""What every byte tier (memory, disk, Redis) offers the tiered store, and the value it stores."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from cachelayer.stats import TierSnapshot

__all__ = ["DEFAULT_COST", "Entry", "Tier"]

DEFAULT_COST = 1.0
"""Cost of recomputing an entry when the caller gives none (only the ``adaptive`` policy reads it)."""


class Entry(NamedTuple):
    """A stored value with the metadata that travels with it between tiers.

    A named tuple rather than a frozen dataclass: every store builds one and every demotion moves
    one, and a tuple is built in a fifth of the time (no ``object.__setattr__`` per field).
    """

    data: bytes
    expires_at: float | None
    """Wall-clock time (seconds since the epoch) after which the entry is gone; None = no TTL."""
    cost: float = DEFAULT_COST
    """What recomputing the value would cost, in the caller's unit (e.g. prefill tokens)."""


class Tier(Protocol):
    """One level of the store. Not thread-safe alone: the ``TieredStore`` serialises calls."""

    name: str
    demotes: bool
    """Whether ``put`` hands back what it evicts; the store turns it off where no tier below takes it."""

    def get(self, key: bytes) -> Entry | None:
        """The live entry for ``key``, or None (a miss; expired or corrupt entries are dropped)."""
        ...

    def contains(self, key: bytes) -> bool:
        """Whether a live entry for ``key`` is held, without reading it or counting a query."""
        ...

    def put(self, key: bytes, entry: Entry) -> list[tuple[bytes, Entry]]:
        """Store ``entry``; returns the live entries pushed out to make room (for demotion).

        An entry larger than the whole tier is not stored and comes back in the returned list.
        """
        ...

    def delete(self, key: bytes) -> bool:
        """Drop ``key``; True when it was present."""
        ...

    def clear(self) -> None:
        """Drop every entry."""
        ...

    def stats(self) -> TierSnapshot:
        """Counters and size now."""
        ...

    def close(self) -> None:
        """Release files, locks and connections."""
        ...
