"""The embedded engine's store of offloaded KV pages, as `/v1/cache/stats` and `/metrics` see it.

Engines are asked through a small protocol (`kv_offload_stats`), so the gateway reads live counters
without importing the engine (or torch).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from cachelayer.stats import StoreSnapshot
from proxy.routing.pool import WorkerPool


class OffloadFigures(Protocol):
    """What an engine that offloads KV pages reports (`adapters.local.offload.OffloadStats` has these)."""

    @property
    def store(self) -> StoreSnapshot: ...
    @property
    def offloaded_pages(self) -> int: ...
    @property
    def loaded_pages(self) -> int: ...
    @property
    def written_behind_pages(self) -> int: ...
    @property
    def write_behind_pending_pages(self) -> int: ...
    @property
    def skipped_pages(self) -> int: ...
    @property
    def rejected_pages(self) -> int: ...
    @property
    def prefill_tokens_per_s(self) -> float | None: ...
    @property
    def load_bytes_per_s(self) -> tuple[tuple[str, float], ...]: ...


@runtime_checkable
class ReportsKvOffload(Protocol):
    def kv_offload_stats(self) -> OffloadFigures | None:
        """The engine's KV page store figures, None before it started or without offload."""
        ...


class KvPagesStats(msgspec.Struct, kw_only=True):
    """One engine's store of offloaded KV pages."""

    worker: str
    hits: int
    """Pages loaded back into the engine's pool."""
    misses: int
    """Lookups past the engine's radix match that stopped: page absent, damaged or not worth loading."""
    offloaded_pages: int
    loaded_pages: int
    written_behind_pages: int
    """Cached (not evicted) pages written to disk so that they outlive the process."""
    write_behind_pending_pages: int
    """Cached pages with no disk copy yet (written once due, or by the shutdown flush)."""
    skipped_pages: int
    """Pages found but left, the estimate saying recomputing them is cheaper."""
    rejected_pages: int
    """Pages found with another layout (model, dtype, page size), treated as misses."""
    prefill_tokens_per_s: float | None
    """The engine's measured prefill speed (null until measured)."""
    load_bytes_per_s: dict[str, float]
    """Measured load speed per tier."""


def kv_pages_stats(worker: str, figures: OffloadFigures) -> KvPagesStats:
    """The `kv_cache.kv_pages` entry of one engine."""
    return KvPagesStats(
        worker=worker,
        hits=figures.store.hits,
        misses=figures.store.misses,
        offloaded_pages=figures.offloaded_pages,
        loaded_pages=figures.loaded_pages,
        written_behind_pages=figures.written_behind_pages,
        write_behind_pending_pages=figures.write_behind_pending_pages,
        skipped_pages=figures.skipped_pages,
        rejected_pages=figures.rejected_pages,
        prefill_tokens_per_s=figures.prefill_tokens_per_s,
        load_bytes_per_s=dict(figures.load_bytes_per_s),
    )


def kv_offloads(router: WorkerPool) -> list[tuple[str, OffloadFigures]]:
    """(worker id, figures) of every engine that offloads KV pages."""
    workers = router.workers()
    found: list[tuple[str, OffloadFigures]] = []
    for worker in workers:
        engine = worker.engine
        figures = engine.kv_offload_stats() if isinstance(engine, ReportsKvOffload) else None
        if figures is not None:
            found.append((worker.id, figures))
    return found
