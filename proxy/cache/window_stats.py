"""`cache_manager.sliding_window` of `GET /v1/cache/stats`: the embedded engines' sliding windows.

Summed over the workers whose engine reports window figures (`adapters.local.EngineStats`):
`hits` = windowed prompts whose kept cache (sinks, pinned turn, window) started from cached pages
(an earlier turn's kept window, or the radix cache's prefix), `misses` = those that computed it
from their first token, `evictions` = pages that slid out of windows and went back to the pool,
`memory_bytes` = KV bytes of the running windows and of the kept windows awaiting their next
turn, `utilization` = the running windows' pages against the most they may hold (percent),
`offloaded` / `offload_hits` = kept windows saved to the offload tiers / loaded back. An upstream engine
reports none: its figures are not the gateway's to know.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from proxy.routing.pool import WorkerPool


@runtime_checkable
class WindowFigures(Protocol):
    """What an engine with sliding-window attention reports."""

    window_hits: int
    window_misses: int
    window_slid_pages: int
    window_pages: int
    window_capacity_pages: int
    window_kept_pages: int
    window_offloaded: int
    window_loaded: int
    page_size: int
    kv_bytes_per_token: int


class WindowTotals:
    """The window figures of every embedded engine, summed."""

    __slots__ = (
        "capacity_bytes",
        "evictions",
        "hits",
        "memory_bytes",
        "misses",
        "offload_hits",
        "offloaded",
        "running_bytes",
    )

    def __init__(self) -> None:
        self.hits = self.misses = self.evictions = self.memory_bytes = self.capacity_bytes = 0
        self.running_bytes = self.offloaded = self.offload_hits = 0

    @property
    def utilization(self) -> float:
        """Held KV bytes against the most the running windows may hold, as a fraction."""
        return self.running_bytes / self.capacity_bytes if self.capacity_bytes else 0.0


def window_totals(router: WorkerPool) -> WindowTotals:
    """Sum the window figures of the workers whose engines report them."""
    totals = WindowTotals()
    for worker in router.workers():
        stats = getattr(worker.engine, "stats", None)
        figures = stats() if callable(stats) else None
        if not isinstance(figures, WindowFigures):
            continue
        page_bytes = figures.page_size * figures.kv_bytes_per_token
        totals.hits += figures.window_hits
        totals.misses += figures.window_misses
        totals.evictions += figures.window_slid_pages
        totals.offloaded += figures.window_offloaded
        totals.offload_hits += figures.window_loaded
        totals.memory_bytes += (figures.window_pages + figures.window_kept_pages) * page_bytes
        totals.running_bytes += figures.window_pages * page_bytes
        totals.capacity_bytes += figures.window_capacity_pages * page_bytes
    return totals
