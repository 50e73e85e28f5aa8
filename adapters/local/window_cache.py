"""Window reuse: the kept caches (sinks, pinned turn, window) of finished windowed sequences.

A windowed conversation's next request starts with the whole history of the last one (the
prompt, the answer, then the new turn). The radix cache cannot serve it once the window slid:
its pages no longer hold the history in order. So a windowed sequence that slid leaves its
kept cache here when it finishes, keyed by its salt and its full token history, and a later
windowed prompt that starts with that history takes it over (a window hit) and computes only
what follows. An entry is taken, not shared, so no page is ever rotated under another holder.

Entries are dropped oldest first beyond `max_entries` and when the pool needs their pages (both
hand the entry to `on_drop` first: `window_store` saves it to the offload tiers), and on a cache
flush.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from adapters.local.kv_pool import KVPool
from adapters.local.window import WindowState

DEFAULT_WINDOW_CACHE_ENTRIES = 16
"""Kept caches held for reuse (about 1,100 pages at most with the default window)."""


@dataclass(slots=True)
class KeptWindow:
    """One finished sequence's kept cache: its pages (references held here) and window state."""

    salt: str
    history: bytes
    """The token ids the kept cache stands for, as int32 bytes (compared as a prefix)."""
    tokens: int
    pages: list[int]
    window: WindowState
    settled: bool = True
    """False while key moves queued this step are still to run on its pages (a sequence preempted
    after its slide): it is not dropped, saved or released before they ran."""


class WindowCache:
    """Kept caches by (salt, token history), least recently stored dropped first. Engine thread only."""

    def __init__(
        self,
        pool: KVPool,
        max_entries: int = DEFAULT_WINDOW_CACHE_ENTRIES,
        on_drop: Callable[[KeptWindow], object] | None = None,
    ) -> None:
        self.pool = pool
        self.max_entries = max_entries
        self.on_drop = on_drop
        """Called with an entry leaving for room (its pages still hold its K/V), not on a flush."""
        self._entries: OrderedDict[int, KeptWindow] = OrderedDict()
        self._ids = 0

    @property
    def pages(self) -> int:
        """Pages held for reuse."""
        return sum(len(entry.pages) + len(entry.window.anchors) for entry in self._entries.values())

    def keep(
        self, salt: str, tokens: list[int], pages: list[int], window: WindowState, *, settled: bool = True
    ) -> None:
        """Hold a finished sequence's kept cache (its page references move here)."""
        history = array("i", tokens).tobytes()
        for key, entry in list(self._entries.items()):
            if entry.salt == salt and entry.history == history:
                self._drop(key)
        self._ids += 1
        self._entries[self._ids] = KeptWindow(salt, history, len(tokens), pages, window, settled)
        while len(self._entries) > self.max_entries and self._droppable():
            self._drop(self._droppable()[0], room=True)

    def take(self, salt: str, tokens: list[int], at_least: int) -> KeptWindow | None:
        """Remove and return the longest kept cache whose history `tokens` starts with and which
        covers more than `at_least` tokens; None when there is none."""
        prompt = array("i", tokens).tobytes()
        best: tuple[int, KeptWindow] | None = None
        for key, entry in self._entries.items():
            fits = entry.salt == salt and entry.tokens > at_least and prompt.startswith(entry.history)
            if fits and (best is None or entry.tokens > best[1].tokens):
                best = (key, entry)
        if best is None:
            return None
        del self._entries[best[0]]
        return best[1]

    def evict(self, pages: int) -> None:
        """Drop the oldest entries until at least `pages` pages went back to the pool (or none is left)."""
        freed = 0
        while freed < pages and self._droppable():
            freed += self._drop(self._droppable()[0], room=True)

    def settle(self) -> None:
        """A step ran: every entry's key moves are done."""
        for entry in self._entries.values():
            entry.settled = True

    def _droppable(self) -> list[int]:
        """Keys of the entries that may leave, oldest first."""
        return [key for key, entry in self._entries.items() if entry.settled]

    def clear(self) -> None:
        while self._entries:
            self._drop(next(iter(self._entries)))

    def entries(self) -> Iterator[KeptWindow]:
        """The entries held, oldest first."""
        return iter(list(self._entries.values()))

    def _drop(self, key: int, *, room: bool = False) -> int:
        entry = self._entries.pop(key)
        if room and self.on_drop is not None:
            self.on_drop(entry)
        self.pool.release(entry.pages + entry.window.anchors)
        return len(entry.pages) + len(entry.window.anchors)
