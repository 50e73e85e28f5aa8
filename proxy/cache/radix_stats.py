"""`cache_manager.radix_tree` of `GET /v1/cache/stats`: the prefix caches of every worker.

Per worker, the engine's own radix cache where the engine reports one
(the embedded engine: `engines`), else the routing tree (the router's picture of an upstream
engine's prefix cache: `workers`); the headline fields sum them. `prefix_matches` = prompt tokens
found in a prefix cache (an upstream: those its tree predicted), `sharing_hits` = prompt tokens
served from prefix caches (an upstream: those it reported; the embedded engine's match is what it
serves, so both count the same tokens there), `active_prefixes` = radix nodes, `avg_prefix_length`
= cached tokens per node, `memory_saved` = KV bytes the embedded engines read from their caches
instead of computing (hit tokens times KV bytes per token; null when no engine can say: the
gateway cannot know an upstream's KV bytes per token). `tree_tokens` and `tree_memory_bytes`
describe the routing trees only.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from proxy.routing.pool import WorkerPool


def percent(fraction: float) -> float:
    return round(100.0 * fraction, 2)


class PrefixCacheFigures(Protocol):
    """What an engine with its own radix cache reports (`adapters.local.EngineStats` has these)."""

    cached_tokens: int
    cache_hit_tokens: int
    cache_query_tokens: int
    cache_nodes: int
    kv_bytes_per_token: int


@runtime_checkable
class ReportsPrefixCache(Protocol):
    def stats(self) -> PrefixCacheFigures | None:
        """The engine's prefix-cache figures, None before it started."""
        ...


class EngineRadixStats(msgspec.Struct, kw_only=True):
    worker: str
    cached_tokens: int
    hit_tokens: int
    query_tokens: int
    hit_rate: float
    nodes: int
    """Nodes of the engine's radix tree."""
    reused_kv_bytes: int
    """KV bytes of the hit tokens: what the engine read from its cache instead of computing."""


class WorkerTreeStats(msgspec.Struct, kw_only=True):
    worker: str
    tree_tokens: int
    tree_nodes: int
    predicted_cached_tokens: int
    reported_cached_tokens: int


class RadixTreeStats(msgspec.Struct, kw_only=True):
    implemented: bool = True
    prefix_matches: int
    sharing_hits: int
    memory_saved: int | None = None
    active_prefixes: int
    avg_prefix_length: float
    tree_tokens: int
    tree_memory_bytes: int
    workers: list[WorkerTreeStats]
    engines: list[EngineRadixStats]


def radix_stats(router: WorkerPool) -> RadixTreeStats:
    """Per worker, the engine's own radix cache where it reports one, else the routing tree; summed."""
    workers = router.workers()
    trees = [
        WorkerTreeStats(
            worker=w.id,
            tree_tokens=w.tree.total_tokens,
            tree_nodes=w.tree.node_count,
            predicted_cached_tokens=w.predicted_tokens,
            reported_cached_tokens=w.reported_cached_tokens,
        )
        for w in workers
    ]
    engines: list[EngineRadixStats] = []
    matches = sharing = nodes = node_tokens = 0
    saved: int | None = None
    for worker, tree in zip(workers, trees, strict=True):
        figures = worker.engine.stats() if isinstance(worker.engine, ReportsPrefixCache) else None
        if figures is None:  # an upstream engine: the router's picture of its cache
            matches += tree.predicted_cached_tokens
            sharing += tree.reported_cached_tokens
            nodes += tree.tree_nodes
            node_tokens += tree.tree_tokens
            continue
        queried = figures.cache_query_tokens
        engines.append(
            EngineRadixStats(
                worker=worker.id,
                cached_tokens=figures.cached_tokens,
                hit_tokens=figures.cache_hit_tokens,
                query_tokens=queried,
                hit_rate=percent(figures.cache_hit_tokens / queried) if queried else 0.0,
                nodes=figures.cache_nodes,
                reused_kv_bytes=figures.cache_hit_tokens * figures.kv_bytes_per_token,
            )
        )
        matches += figures.cache_hit_tokens
        sharing += figures.cache_hit_tokens
        nodes += figures.cache_nodes
        node_tokens += figures.cached_tokens
        saved = (saved or 0) + figures.cache_hit_tokens * figures.kv_bytes_per_token
    return RadixTreeStats(
        prefix_matches=matches,
        sharing_hits=sharing,
        memory_saved=saved,
        active_prefixes=nodes,
        avg_prefix_length=round(node_tokens / nodes, 2) if nodes else 0.0,
        tree_tokens=sum(t.tree_tokens for t in trees),
        tree_memory_bytes=sum(w.tree_memory_bytes() for w in workers),
        workers=trees,
        engines=engines,
    )
