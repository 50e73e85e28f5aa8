"""Write-behind of hot KV pages to the L3 disk tier, so the prefix cache outlives the process.

Eviction alone never saves the pages worth keeping: a hot prefix is never evicted. So a whole page
the prefix cache adopts is also written to disk once it is *due*, under one rule:

    due = used a second time (a later prompt's match reused it)
          or cached for `after_s` seconds (`local_engine.kv_write_behind_after_s`), whichever is first

Each engine iteration writes at most `DEFAULT_PAGES_PER_STEP` due pages: the engine thread copies a
page out of the pool (a memcpy) and queues it for the disk tier's writer thread, which checksums,
writes and fsyncs it. While the engine has work, copies are also held to `DEFAULT_BUSY_BYTES_PER_S`
(a token bucket): each page costs ~2 ms of CPU between the two threads, taken from decode on a small
machine. An idle engine writes as fast as the writer's bounded queue takes pages. A page the queue
cannot take now waits for a later iteration, so decode never waits on the disk.

`flush` runs at shutdown, after the engine thread has stopped, so the pool no longer changes:
every tracked page not yet written goes to disk at once, from the pool's memory (no copy, no queue:
`KVOffload.persist_now`, after the records already queued), until a deadline
(`cache.shutdown_flush_s`). Copying each page out and handing it to the writer thread, as `step`
does, cost twice the time: a 64k-token flush (3 GB of fp32 KV) took 9-14 s here.

Keys are the offload store's chained block hashes (`KVOffload.keys`: model, dtype, GGUF and tenant
salt in the seed), so the next process finds a page by the same prefix. Its radix tree starts empty
and is rebuilt lazily: a prompt that misses the tree continues into the store (`PrefixCache.match`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapters.local.offload import KVOffload

logger = logging.getLogger(__name__)

DEFAULT_PAGES_PER_STEP = 4
"""Due pages copied out per engine step (bounds the step's added time to a few memcpys)."""
DEFAULT_BUSY_BYTES_PER_S = 16 * 1024 * 1024
"""Disk copies per second while the engine has work (~22 SmolLM2 fp32 pages: ~2 % of two cores)."""
RETRY_WHEN_FULL_S = 0.05
"""How soon an idle engine looks again when the writer's queue was full."""


@dataclass(slots=True)
class _Tracked:
    key: bytes
    since: float


@dataclass(frozen=True, slots=True)
class FlushResult:
    """What a shutdown flush did."""

    written: int
    left: int
    """Tracked pages not written before the deadline (the next process recomputes them)."""
    seconds: float


class WriteBehind:
    """Cached pages without a disk copy yet, and the rule that writes them. Engine thread only."""

    def __init__(
        self,
        offload: KVOffload,
        *,
        after_s: float,
        pages_per_step: int = DEFAULT_PAGES_PER_STEP,
        busy_bytes_per_s: float = DEFAULT_BUSY_BYTES_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.offload = offload
        self.after_s = after_s
        self.pages_per_step = pages_per_step
        self.busy_bytes_per_s = busy_bytes_per_s
        self._clock = clock
        self._burst = pages_per_step * offload.page_bytes
        self._budget = float(self._burst)  # bytes a busy engine may still copy now
        self._budget_at = clock()
        self._tracked: dict[int, _Tracked] = {}  # pool page -> its key; insertion (age) order
        self._due: dict[int, None] = {}  # pages used twice, in the order they became due
        self.written_pages = 0
        """Pages queued for the disk tier since start (shutdown flush included)."""
        self.last_flush: FlushResult | None = None

    @property
    def pending_pages(self) -> int:
        """Cached pages that have no disk copy yet."""
        return len(self._tracked)

    def track(self, pages: Iterable[tuple[int, bytes]]) -> None:
        """The prefix cache adopted these (page, key) pairs: they are written once due."""
        now = self._clock()
        for page, key in pages:
            if not self.offload.on_disk(key):
                self._tracked[page] = _Tracked(key, now)

    def used(self, pages: Iterable[int]) -> None:
        """A prompt's match reused these pages: the tracked ones are due now."""
        for page in pages:
            if page in self._tracked:
                self._due[page] = None

    def forget(self, pages: Iterable[int]) -> None:
        """These pages left the cache (evicted: the offload saves them its own way)."""
        for page in pages:
            if self._tracked.pop(page, None) is not None:
                self._due.pop(page, None)

    def step(self, *, busy: bool) -> float | None:
        """Write due pages (up to `pages_per_step`; while `busy`, within the byte budget); return
        seconds until the next is due, 0 when more are due now, None when none is tracked."""
        now = self._clock()
        page_bytes = self.offload.page_bytes
        if busy:
            refill = (now - self._budget_at) * self.busy_bytes_per_s
            self._budget = min(self._budget + refill, float(self._burst))
        else:
            self._budget = float(self._burst)
        self._budget_at = now
        written = 0
        while written < self.pages_per_step:
            page = self._next_due(now)
            if page is None:
                break
            if busy and self._budget < page_bytes:
                return (page_bytes - self._budget) / self.busy_bytes_per_s
            if not self.offload.disk_has_room():
                return RETRY_WHEN_FULL_S
            self._write(page)
            written += 1
            if busy:
                self._budget -= page_bytes
        if self._due:
            return 0.0
        oldest = next(iter(self._tracked.values()), None)
        return None if oldest is None else max(0.0, oldest.since + self.after_s - now)

    def flush(self, deadline: float) -> FlushResult:
        """Write every tracked page to disk, until `time.monotonic()` reaches `deadline`. Only once
        the engine thread has stopped: pages are written from the pool's memory."""
        started = time.monotonic()
        written = 0
        for page, tracked in list(self._tracked.items()):
            if time.monotonic() >= deadline:
                break
            if self.offload.persist_now(tracked.key, page, deadline):
                written += 1
            elif time.monotonic() >= deadline:
                break  # cut short by the deadline: still tracked, counted as left
            del self._tracked[page]
            self._due.pop(page, None)
        self.written_pages += written
        result = FlushResult(written=written, left=len(self._tracked), seconds=time.monotonic() - started)
        self.last_flush = result
        if written or result.left:
            logger.info(
                "KV write-behind flush: %d pages written to disk in %.2f s, %d left unwritten",
                written,
                result.seconds,
                result.left,
            )
        return result

    def _next_due(self, now: float) -> int | None:
        if self._due:
            return next(iter(self._due))
        oldest = next(iter(self._tracked.items()), None)
        if oldest is not None and oldest[1].since + self.after_s <= now:
            return oldest[0]
        return None

    def _write(self, page: int) -> None:
        tracked = self._tracked.pop(page)
        self._due.pop(page, None)
        if self.offload.persist(tracked.key, page):
            self.written_pages += 1
