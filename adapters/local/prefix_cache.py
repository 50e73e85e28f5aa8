"""RadixAttention for the embedded engine: a `cachelayer.radix.RadixTree` whose values are KV pages.

- Match on admission: the longest cached run of whole pages is reused; the sequence takes a
  reference on those pages and locks the deepest matched node so eviction cannot take them.
- Insert as KV appears (after each prefill chunk and when a sequence finishes): the tree takes a
  reference on each page it adopts; pages it already had (computed twice by concurrent
  requests) stay with the sequence and are freed when it releases them.
- Evict leaf-first (LRU or FIFO) when the pool is short of pages, or to keep the cache under
  `max_cached_tokens`; evicted pages lose the tree's reference.

Tenant isolation: the gateway's `cache_salt` becomes one leading page of pseudo tokens (ids at or
above 2**31, never real vocabulary), so tenants share one tree, one eviction order and one
memory budget, yet can never match each other's prefixes. That page stores `NO_PAGE`.

With a `KVOffload`, evicted pages are saved to its L2/L3 store first (the tree's `on_evict`), and a
match continues past the tree into that store: pages found there and worth loading are copied into
free pool pages and inserted into the tree, then matched like any cached page. With the offload's
write-behind (an L3 directory), pages the tree adopts are also written to disk once due
(`adapters.local.write_behind`), so a restart finds them: the new process's tree starts empty and
fills from the store as prompts miss it.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from dataclasses import dataclass

from adapters.local.kv_pool import KVPool
from adapters.local.offload import KVOffload
from cachelayer.radix import EvictedSpan, MatchResult, RadixNode, RadixTree

logger = logging.getLogger(__name__)

NO_PAGE = -1
"""Value of a salt page: it has no KV behind it."""
SALT_TOKEN_BASE = 1 << 31


@dataclass(slots=True, frozen=True)
class PrefixHit:
    """A reused prefix: its length in tokens, its pages (one reference taken) and the locked node."""

    tokens: int
    pages: list[int]
    node: RadixNode[int]


class PrefixCache:
    """Owns the radix tree's references into the KV pool. Engine thread only."""

    def __init__(
        self,
        pool: KVPool,
        *,
        enabled: bool,
        max_cached_tokens: int | None,
        policy: str,
        offload: KVOffload | None = None,
    ) -> None:
        self.pool = pool
        self.enabled = enabled
        self.page_size = pool.page_size
        self.max_cached_tokens = max_cached_tokens
        self.offload = offload if enabled else None
        self.write_behind = self.offload.write_behind if self.offload is not None else None
        on_evict = self._save_evicted if self.offload is not None else None
        self._tree: RadixTree[int] = RadixTree(page_size=pool.page_size, policy=policy, on_evict=on_evict)
        self._salts: dict[str, list[int]] = {}
        self._salt_of: dict[int, str] = {}  # first pseudo token of a salt page -> the salt
        self._pages: set[int] = set()
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.evicted_pages = 0

    @property
    def root(self) -> RadixNode[int]:
        return self._tree.root

    def match(self, salt: str, tokens: list[int]) -> PrefixHit:
        """Reuse the longest cached whole-page prefix of `tokens` (retain its pages, lock its node)."""
        if not self.enabled:
            return PrefixHit(tokens=0, pages=[], node=self._tree.root)
        head = self._salt_tokens(salt)
        key = head + tokens
        found = self._tree.match_prefix(key)
        if (
            self.offload is not None
            and found.length + self.page_size <= len(key)
            and self._restore(salt, head, tokens, found)
        ):
            found = self._tree.match_prefix(key)
        pages = [p for p in found.values if p != NO_PAGE]
        matched = max(found.length - len(head), 0)
        if self.write_behind is not None:
            self.write_behind.used(pages)
        self._tree.lock(found.node)
        self.pool.retain(pages)
        return PrefixHit(tokens=matched, pages=pages, node=found.node)

    def continuation(self, salt: str, tokens: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens that an earlier request of this tenant went on with after exactly
        `tokens` (a speculative draft); a read, which neither locks nor refreshes anything."""
        if not self.enabled:
            return []
        return self._tree.continuation(self._salt_tokens(salt) + tokens, limit)

    def record(self, queried: int, hit: int) -> None:
        """Count one admitted prompt's lookup for the hit-rate figures."""
        self.queried_tokens += queried
        self.hit_tokens += hit

    def insert(self, salt: str, tokens: list[int], pages: list[int]) -> RadixNode[int]:
        """Cache the whole pages of `tokens` (K/V in `pages`); return the node to lock for them."""
        if not self.enabled:
            return self._tree.root
        head = self._salt_tokens(salt)
        whole = len(tokens) - len(tokens) % self.page_size
        key = head + tokens[:whole]
        values = [NO_PAGE] * (len(head) // self.page_size) + pages[: whole // self.page_size]
        present = self._tree.insert(key, values) // self.page_size
        adopted = [p for p in values[present:] if p != NO_PAGE]
        self.pool.retain(adopted)
        self._pages.update(adopted)
        if self.write_behind is not None and adopted:
            assert self.offload is not None
            head_pages = len(head) // self.page_size
            keys = self.offload.keys(salt, tokens[:whole])
            first = max(present, head_pages)
            self.write_behind.track(zip(values[first:], keys[first - head_pages :], strict=True))
        return self._tree.match_prefix(key).node

    def lock(self, node: RadixNode[int]) -> None:
        self._tree.lock(node)

    def unlock(self, node: RadixNode[int]) -> None:
        self._tree.unlock(node)

    def evict(self, pages: int) -> int:
        """Drop at least `pages` cached pages if unlocked ones exist; return pages actually evicted."""
        if pages <= 0 or not self.enabled:
            return 0
        freed = [p for p in self._tree.evict(pages * self.page_size) if p != NO_PAGE]
        self._forget(freed)
        self.evicted_pages += len(freed)
        return len(freed)

    def clear(self) -> None:
        """Drop every cached prefix no running sequence has locked, and every offloaded page."""
        self._forget([p for p in self._tree.clear() if p != NO_PAGE])
        if self.offload is not None:
            self.offload.clear()

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """An engine step computed `tokens` prompt tokens in `seconds` (feeds the offload's estimate)."""
        if self.offload is not None:
            self.offload.observe_prefill(tokens, seconds)

    def enforce_cap(self) -> None:
        """Evict until the cache holds at most `max_cached_tokens` (locked pages excepted)."""
        if self.max_cached_tokens is None:
            return
        while self.cached_pages * self.page_size > self.max_cached_tokens:
            excess = self.cached_pages - self.max_cached_tokens // self.page_size
            if self.evict(excess) == 0:
                return

    def write_due(self, *, busy: bool) -> float | None:
        """Write due pages to disk (a bounded few; fewer while `busy`); seconds until the next is
        due, None if none is tracked."""
        return self.write_behind.step(busy=busy) if self.write_behind is not None else None

    def _forget(self, freed: list[int]) -> None:
        """Pages the tree dropped: release its references, stop tracking them for write-behind."""
        self.pool.release(freed)
        self._pages.difference_update(freed)
        if self.write_behind is not None:
            self.write_behind.forget(freed)

    @property
    def node_count(self) -> int:
        """Nodes of the radix tree (salt pages included)."""
        return self._tree.node_count

    @property
    def cached_pages(self) -> int:
        """Pages the tree holds a reference on."""
        return len(self._pages)

    def cached_only_pages(self) -> int:
        """Cached pages no running sequence holds (what eviction could free right now)."""
        return sum(1 for page in self._pages if self.pool.refcount(page) == 1)

    def _salt_tokens(self, salt: str) -> list[int]:
        if not salt:
            return []
        tokens = self._salts.get(salt)
        if tokens is None:
            digest = hashlib.shake_128(salt.encode("utf-8")).digest(4 * self.page_size)
            words = array("I", digest)
            tokens = [SALT_TOKEN_BASE | (w & (SALT_TOKEN_BASE - 1)) for w in words]
            self._salts[salt] = tokens
            self._salt_of[tokens[0]] = salt
        return tokens

    def _restore(self, salt: str, head: list[int], tokens: list[int], found: MatchResult[int]) -> bool:
        """Load the offloaded pages that continue `found` into the pool and the tree; True if any."""
        assert self.offload is not None
        cached = [p for p in found.values if p != NO_PAGE]
        planned = self.offload.plan(salt, tokens, start_page=len(cached))
        if not planned:
            return False
        self._tree.lock(found.node)  # making room below must not evict the pages we extend
        try:
            short = len(planned) - self.pool.free_pages
            if short > 0:
                self.evict(short)
            pages = self.pool.alloc(min(len(planned), self.pool.free_pages)) or []
            loaded = self.offload.load(planned, pages)
            self.pool.release(pages[loaded:])
            if not loaded:
                return False
            end = (len(cached) + loaded) * self.page_size
            values = [NO_PAGE] * (len(head) // self.page_size) + cached + pages[:loaded]
            present = self._tree.insert(head + tokens[:end], values) // self.page_size
            # The tree takes over the reference `alloc` gave each adopted page.
            adopted = {p for p in values[present:] if p != NO_PAGE}
            self.pool.release([p for p in pages[:loaded] if p not in adopted])
            self._pages.update(adopted)
            return True
        finally:
            self._tree.unlock(found.node)

    def _save_evicted(self, span: EvictedSpan[int]) -> None:
        """`on_evict`: hand an evicted node's pages to the offload store before they are freed."""
        assert self.offload is not None
        prefix = span.prefix_tokens
        salt = self._salt_of.get(prefix[0], "") if prefix and prefix[0] >= SALT_TOKEN_BASE else ""
        head_pages = 1 if salt else 0
        first = span.start // self.page_size
        pages = [p for p in span.values if p != NO_PAGE]
        if not pages:
            return
        tokens = prefix[head_pages * self.page_size :]
        try:
            self.offload.save(salt, tokens, max(first - head_pages, 0), pages)
        except Exception:  # a failed offload only loses a cache entry; eviction must go on
            logger.exception("offloading %d evicted KV pages failed", len(pages))
