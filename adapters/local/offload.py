"""KV offload: pages the prefix cache evicts move to L2 (memory) and L3 (disk) instead of being lost.

    evict (engine thread)   radix leaf -> encode each page (header + raw K/V, `offload_codec`)
                            -> L2 put (a memory copy) and L3 put (queued for the disk tier's writer)
    persist (engine thread) a cached page that is due (`write_behind`: used twice, or cached long
                            enough) -> encode -> L3 put only; it stays in the pool meanwhile
    persist_now (shutdown)  the same once the engine thread has stopped (`WriteBehind.flush`): the
                            record is written at once from the pool's memory, with no copy
    admit (engine thread)   after the radix match: next block keys -> which tier holds each page ->
                            load while the cost model says loading beats recomputing -> copy into
                            free pool pages -> insert into the radix tree (`PrefixCache.match`)

Keys are `cachelayer.keys` chained block hashes with block size = page size, seeded with the model
id and KV dtype (`smollm2-135m-instruct/float32`), the GGUF's sha256 (it carries the tokenizer and
template) and the tenant's cache salt, so a page is found again only for the same prefix, model,
dtype and tenant, after a restart too (L3 files persist).

The store is a `cachelayer.tiers.TieredStore` in `write_through` mode over an uncompressed memory
tier (`kv_l2`; fp32 KV hardly compresses and zstd would cost the engine thread) and, with a
directory, a disk tier (`kv_l3`) in `write_behind` mode: eviction pays a memory copy and a queue
append, and the disk tier's writer thread writes and fsyncs the files, so the decode loop never
waits on the disk. A page whose write the queue cannot take (over `DEFAULT_MAX_PENDING_BYTES`) lives in
L2 only. Loads run on the engine thread: they happen at admission, and only when they are cheaper
than the prefill they replace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from adapters.local.kv_pool import KVPool
from adapters.local.offload_codec import PageCodec
from adapters.local.offload_cost import LoadCostModel
from adapters.local.write_behind import WriteBehind
from cachelayer.disk import DiskTier, DiskTierConfig
from cachelayer.keys import KeySeed, chain_hashes, seed_hash
from cachelayer.memory import MemoryTier, MemoryTierConfig
from cachelayer.stats import StoreSnapshot
from cachelayer.tier import Tier
from cachelayer.tiers import TieredStore

logger = logging.getLogger(__name__)

L2_TIER = "kv_l2"
L3_TIER = "kv_l3"
DEFAULT_MAX_PENDING_BYTES = 256 * 1024 * 1024
"""Encoded pages queued for the L3 writer; more are kept in L2 only (about 350 SmolLM2 fp32 pages)."""


@dataclass(frozen=True, slots=True)
class OffloadStats:
    """The offload store's counters at one moment."""

    store: StoreSnapshot
    """Page lookups past the radix match (hits: loaded; misses: where the chain stopped, the page
    absent, damaged or not worth loading), and the `kv_l2` / `kv_l3` tiers' own counters."""
    offloaded_pages: int
    """Evicted pages written to the store."""
    offload_seconds: float
    """Engine-thread time spent encoding and storing evicted pages (the eviction's stall)."""
    loaded_pages: int
    """Pages loaded back into the pool (their tokens count as cached)."""
    written_behind_pages: int
    """Cached (not evicted) pages written to L3 by the write-behind, shutdown flush included."""
    write_behind_pending_pages: int
    """Cached pages with no L3 copy yet."""
    skipped_pages: int
    """Lookups that found a page but left it, the estimate saying recomputing is cheaper."""
    rejected_pages: int
    """Pages found with another layout (model, dtype, page size or format): dropped, treated as misses."""
    prefill_tokens_per_s: float | None
    """The running prefill-speed estimate (None until measured)."""
    load_bytes_per_s: tuple[tuple[str, float], ...]
    """The running load-speed estimate of each tier measured so far."""


@dataclass(frozen=True, slots=True)
class PlannedLoad:
    """A page worth loading: its key and the tier that holds it."""

    key: bytes
    tier: str


class KVOffload:
    """The L2/L3 store of evicted KV pages for one pool. Engine thread only, except `stats`."""

    def __init__(
        self,
        pool: KVPool,
        *,
        model_id: str,
        tokenizer_hash: str,
        memory_bytes: int,
        directory: Path | None,
        disk_bytes: int,
        min_speedup: float,
        write_behind_after_s: float | None = None,
    ) -> None:
        """Open the tiers (the L3 directory's files from an earlier run are indexed, not read).

        `write_behind_after_s`: with a directory, cached pages are also written to L3 once due
        (`adapters.local.write_behind`); None writes only evicted pages."""
        self.pool = pool
        self.page_size = pool.page_size
        self.codec = PageCodec(pool)
        self.cost = LoadCostModel(min_speedup=min_speedup)
        self._model_id = model_id
        self._tokenizer_hash = tokenizer_hash
        self._roots: dict[str, bytes] = {}
        tiers: list[Tier] = [MemoryTier(MemoryTierConfig(name=L2_TIER, capacity_bytes=memory_bytes))]
        self.disk: DiskTier | None = None
        """The L3 tier (None without a directory); `persist` writes to it alone."""
        if directory is not None:
            disk = DiskTierConfig(
                directory=directory,
                name=L3_TIER,
                capacity_bytes=disk_bytes,
                write_behind=True,
                max_pending_bytes=DEFAULT_MAX_PENDING_BYTES,
            )
            self.disk = DiskTier(disk)
            tiers.append(self.disk)
        self.store = TieredStore(tiers, write_policy="write_through")
        self.write_behind = (
            WriteBehind(self, after_s=write_behind_after_s)
            if self.disk is not None and write_behind_after_s is not None
            else None
        )
        self.offloaded_pages = 0
        self.loaded_pages = 0
        self.skipped_pages = 0
        self.rejected_pages = 0
        self.offload_seconds = 0.0
        self.persist_seconds = 0.0
        self._hits = 0
        self._misses = 0

    def keys(self, salt: str, tokens: Sequence[int]) -> list[bytes]:
        """One key per whole page of `tokens` (a prompt without the salt page), naming its prefix."""
        root = self._roots.get(salt)
        if root is None:
            seed = KeySeed(model_id=self._model_id, tokenizer_hash=self._tokenizer_hash, tenant_salt=salt)
            root = self._roots[salt] = seed_hash(seed, self.page_size)
        return chain_hashes(root, tokens, block_size=self.page_size)

    def save(self, salt: str, tokens: Sequence[int], first_page: int, pages: Sequence[int]) -> None:
        """Store pool `pages`, which hold token pages `first_page`, `first_page + 1`, ... of `tokens`."""
        started = time.perf_counter()
        keys = self.keys(salt, tokens)
        for index, page in enumerate(pages):
            key = keys[first_page + index]
            tier = self.store.locate(key)
            if tier == L2_TIER:  # loaded from the store, or offloaded before
                continue
            if tier == L3_TIER:  # written behind while cached: a memory copy makes its reload fast
                self.store.put_into(L2_TIER, key, self.codec.encode(page), cost=float(self.page_size))
            else:
                self.store.put(key, self.codec.encode(page), cost=float(self.page_size))
            self.offloaded_pages += 1
        self.offload_seconds += time.perf_counter() - started

    @property
    def page_bytes(self) -> int:
        """Bytes of one encoded page."""
        return self.codec.nbytes

    def on_disk(self, key: bytes) -> bool:
        """Whether the L3 tier holds `key` (False without one: there is nothing to write to)."""
        return self.disk is None or self.disk.contains(key)

    def disk_has_room(self) -> bool:
        """Whether the L3 writer's queue takes one more page now."""
        return self.disk is not None and self.disk.has_room(self.codec.nbytes)

    def finish_by(self, deadline: float) -> None:
        """Shutdown has begun: L3 writes land until `deadline` (`time.monotonic()`), unsynced."""
        if self.disk is not None:
            self.disk.finish_by(deadline)

    def persist(self, key: bytes, page: int) -> bool:
        """Write pool `page` (still cached) to L3 only, under `key`; False when L3 refused it."""
        if self.disk is None or self.disk.contains(key):
            return False
        started = time.perf_counter()
        stored = self.store.put_into(L3_TIER, key, self.codec.encode(page), cost=float(self.page_size))
        self.persist_seconds += time.perf_counter() - started
        return stored

    def persist_now(self, key: bytes, page: int, deadline: float) -> bool:
        """`persist`, written before returning by this thread straight from the pool's memory (no
        copy, no queue): the shutdown flush, once the engine thread has stopped and nothing writes
        the pool. False when L3 refused it or `deadline` (`time.monotonic()`) passed first."""
        if self.disk is None or self.disk.contains(key):
            return False
        parts = self.codec.parts(page)
        return self.disk.put_now(key, parts, cost=float(self.page_size), deadline=deadline)

    def plan(self, salt: str, tokens: Sequence[int], start_page: int) -> list[PlannedLoad]:
        """The run of pages from `start_page` on that the store holds and that is worth loading."""
        planned: list[PlannedLoad] = []
        if not any(tier.entries for tier in self.store.stats().tiers):
            self._misses += 1
            return planned
        for key in self.keys(salt, tokens)[start_page:]:
            tier = self.store.locate(key)
            if tier is None:
                self._misses += 1
                break
            if not self.cost.worth_loading(tier, self.codec.nbytes, self.page_size):
                self.skipped_pages += 1
                self._misses += 1
                break
            planned.append(PlannedLoad(key=key, tier=tier))
        return planned

    def load(self, planned: Sequence[PlannedLoad], pages: Sequence[int]) -> int:
        """Copy planned pages into pool `pages` in order; returns how many leading ones arrived intact."""
        loaded = 0
        for item, page in zip(planned, pages, strict=False):
            started = time.perf_counter()
            data = self.store.get(item.key)  # None: gone since `plan`, or a corrupt file (removed)
            if data is None:
                self._misses += 1
                break
            if not self.codec.decode_into(data, page):
                self.rejected_pages += 1
                self._misses += 1
                self.store.delete(item.key)
                break
            self.cost.observe_load(item.tier, len(data), time.perf_counter() - started)
            loaded += 1
        self.loaded_pages += loaded
        self._hits += loaded
        return loaded

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """One engine step computed `tokens` prompt tokens in `seconds` (the recompute estimate)."""
        self.cost.observe_prefill(tokens, seconds)

    def clear(self) -> None:
        """Drop every offloaded page, in memory and on disk."""
        self.store.clear()

    def close(self, deadline: float | None = None) -> None:
        """Finish queued disk writes (until `time.monotonic()` reaches `deadline`, when given) and
        release the L3 directory."""
        self.store.close(deadline)

    def stats(self) -> OffloadStats:
        """Counters now (safe from any thread)."""
        hits, misses, wb = self._hits, self._misses, self.write_behind
        tiers = self.store.stats().tiers
        return OffloadStats(
            store=StoreSnapshot(queries=hits + misses, hits=hits, misses=misses, tiers=tiers),
            offloaded_pages=self.offloaded_pages,
            offload_seconds=self.offload_seconds,
            loaded_pages=self.loaded_pages,
            written_behind_pages=wb.written_pages if wb is not None else 0,
            write_behind_pending_pages=wb.pending_pages if wb is not None else 0,
            skipped_pages=self.skipped_pages,
            rejected_pages=self.rejected_pages,
            prefill_tokens_per_s=self.cost.prefill.per_second,
            load_bytes_per_s=tuple(
                (name, rate.per_second) for name, rate in list(self.cost.tiers.items()) if rate.per_second
            ),
        )
