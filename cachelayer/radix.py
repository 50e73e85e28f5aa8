"""Token-level radix tree over page-aligned token ids (RadixAttention's prefix index).

One tree serves two users: the embedded engine (nodes hold one KV page handle per page) and the
router (one presence-only tree per worker, no values). Keys are whole pages of ``page_size`` tokens;
a node's key is stored packed as native uint32 bytes, so finding how far a query agrees with a node
is a C-speed slice comparison (memcmp) instead of a per-token Python loop.

Sizes follow mini-sglang: every token is either *evictable* (its node is unlocked) or *protected*
(a lock holds its node or a descendant), so ``evictable_tokens + protected_tokens == total_tokens``.
Eviction removes unlocked leaves oldest first (by last access for ``lru``, by insert time for
``fifo``); a parent whose last child goes becomes a leaf and a candidate in the same pass.

The tree is not thread-safe: its owner (the engine's scheduler thread, a router behind its own lock)
serialises calls.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from cachelayer.token_bytes import TOKEN_BYTES, common_prefix_bytes, pack_tokens, unpack_tokens

__all__ = ["DEFAULT_PAGE_SIZE", "DEFAULT_POLICY", "EvictedSpan", "MatchResult", "RadixNode", "RadixTree"]

V = TypeVar("V")

DEFAULT_PAGE_SIZE = 1
"""Tokens per page: the engine uses its KV page size, routing trees use 1."""
DEFAULT_POLICY: Literal["lru", "fifo"] = "lru"
"""Eviction order: ``lru`` (least recently matched or inserted) or ``fifo`` (oldest insert)."""


class RadixNode(Generic[V]):
    """One edge of the tree: a run of whole pages, its page values and its bookkeeping."""

    __slots__ = (
        "children",
        "created",
        "key",
        "last_access",
        "lock_ref",
        "parent",
        "serial",
        "tick",
        "values",
    )

    def __init__(
        self,
        key: bytes,
        values: list[V] | None,
        parent: RadixNode[V] | None,
        now: float,
        tick: int,
        serial: int,
    ) -> None:
        self.key = key
        self.values = values
        self.parent = parent
        self.children: dict[bytes, RadixNode[V]] = {}
        self.lock_ref = 0
        self.last_access = now
        self.tick = tick  # orders touches that share a clock reading
        self.created = (now, tick)
        self.serial = serial  # unique, so heap entries never compare nodes

    @property
    def num_tokens(self) -> int:
        """Tokens on this node's edge."""
        return len(self.key) // TOKEN_BYTES

    @property
    def tokens(self) -> tuple[int, ...]:
        """This node's own token ids (its edge, not the path from the root)."""
        return unpack_tokens(self.key)


@dataclass(frozen=True, slots=True)
class MatchResult(Generic[V]):
    """Longest cached page-aligned prefix of a query."""

    length: int
    """Matched tokens, a multiple of the page size."""
    values: list[V]
    """One value per matched page (empty for trees that store no values)."""
    node: RadixNode[V]
    """Deepest node holding a matched page (the root if none); locking it protects every matched page."""


@dataclass(frozen=True, slots=True)
class EvictedSpan(Generic[V]):
    """One evicted node, with enough context to key its pages by their full token prefix."""

    prefix_tokens: tuple[int, ...]
    """All tokens from the root through the evicted node."""
    start: int
    """Index in ``prefix_tokens`` where the evicted node's own span begins."""
    values: list[V]
    """The evicted pages' values, one per page."""


class RadixTree(Generic[V]):
    """Radix tree of page-aligned token sequences with ref-count locks and leaf-first eviction."""

    def __init__(
        self,
        page_size: int = DEFAULT_PAGE_SIZE,
        policy: str = DEFAULT_POLICY,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[EvictedSpan[V]], None] | None = None,
    ) -> None:
        """Create an empty tree; ``on_evict`` (which must not raise) sees each node that ``evict`` drops."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if policy not in ("lru", "fifo"):
            raise ValueError(f"unknown radix eviction policy {policy!r}; expected 'lru' or 'fifo'")
        self.page_size = page_size
        self.policy = policy
        self._page_bytes = page_size * TOKEN_BYTES
        self._clock = clock
        self._on_evict = on_evict
        self._ticks = itertools.count()
        self._serials = itertools.count()
        self._root: RadixNode[V] = RadixNode(b"", None, None, clock(), next(self._ticks), next(self._serials))
        self._leaves: set[RadixNode[V]] = set()
        self._evictable = 0
        self._protected = 0
        self._nodes = 0
        self._holds_values: bool | None = None

    @property
    def root(self) -> RadixNode[V]:
        """The root node (empty key, never evicted)."""
        return self._root

    @property
    def total_tokens(self) -> int:
        """Tokens held by the tree."""
        return self._evictable + self._protected

    @property
    def evictable_tokens(self) -> int:
        """Tokens in unlocked nodes."""
        return self._evictable

    @property
    def protected_tokens(self) -> int:
        """Tokens held by locks."""
        return self._protected

    @property
    def node_count(self) -> int:
        """Nodes, not counting the root."""
        return self._nodes

    def match_prefix(self, tokens: Sequence[int], *, touch: bool = True) -> MatchResult[V]:
        """Longest page-aligned prefix of ``tokens`` in the tree; refreshes access times along the path
        unless ``touch`` is False (a look that is not a use, such as a router weighing a worker it
        may not choose, must not keep a prefix alive that the worker's cache is letting go).

        A match ending inside a node splits nothing: it returns that node's whole matched pages.
        Converting a list of ids is most of the cost of a long match: a caller matching one prompt
        against several trees (or matching, then inserting) should pass ``array("I", tokens)`` once.
        """
        query = pack_tokens(tokens, len(tokens) - len(tokens) % self.page_size)
        now, tick = self._clock(), next(self._ticks)
        node, deepest, pos, values = self._root, self._root, 0, []
        while pos < len(query):
            child = node.children.get(query[pos : pos + self._page_bytes])
            if child is None:
                break
            if touch:
                child.last_access, child.tick = now, tick
            deepest = child
            common = common_prefix_bytes(child.key, query, pos, self._page_bytes)
            pos += common
            if child.values is not None:
                values.extend(child.values[: common // self._page_bytes])
            if common < len(child.key):
                break
            node = child
        return MatchResult(length=pos // TOKEN_BYTES, values=values, node=deepest)

    def continuation(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens the tree holds right after the whole of ``tokens`` (which need not
        end on a page), along the most recently used branch; empty when the tree does not hold
        ``tokens``. A read only: access times stay as they are (a speculative draft is not a use).
        """
        query = pack_tokens(tokens, len(tokens))
        node, pos, used = self._root, 0, 0
        while pos < len(query):
            rest = len(query) - pos
            if rest >= self._page_bytes:
                child = node.children.get(query[pos : pos + self._page_bytes])
            else:  # a partial last page: the child whose first page starts with it
                tail = query[pos:]
                child = next((c for key, c in node.children.items() if key.startswith(tail)), None)
            if child is None:
                return []
            used = min(len(child.key), rest)
            if not query.startswith(child.key[:used], pos):
                return []
            pos += used
            node = child
        out = bytearray(node.key[used:])
        while len(out) < limit * TOKEN_BYTES and node.children:
            node = max(node.children.values(), key=self._last_access)
            out += node.key
        return list(unpack_tokens(bytes(out[: limit * TOKEN_BYTES])))

    def insert(self, tokens: Sequence[int], values: Sequence[V] | None = None) -> int:
        """Insert the whole pages of ``tokens``; returns how many leading tokens were already present.

        ``values`` holds one entry per whole page (extra trailing entries, e.g. a partial last page,
        are ignored), or is None for a tree that only tracks presence. The tree keeps its existing
        values for the already-present part: the caller frees its own duplicates there.
        """
        query = pack_tokens(tokens, len(tokens) - len(tokens) % self.page_size)
        pages = len(query) // self._page_bytes
        if values is not None and len(values) < pages:
            raise ValueError(f"insert of {pages} pages got only {len(values)} values")
        if pages == 0:
            return 0
        holds = values is not None
        if self._holds_values is None:
            self._holds_values = holds
        elif self._holds_values != holds:
            kind = "stores one value per page" if self._holds_values else "stores no values"
            raise ValueError(f"this radix tree {kind}")
        now, tick = self._clock(), next(self._ticks)
        node, pos = self._root, 0
        while pos < len(query):
            child = node.children.get(query[pos : pos + self._page_bytes])
            if child is None:
                break
            child.last_access, child.tick = now, tick
            common = common_prefix_bytes(child.key, query, pos, self._page_bytes)
            if common < len(child.key):
                if pos + common == len(query):  # the query ends inside this node: nothing new to add
                    return len(query) // TOKEN_BYTES
                child = self._split(child, common)
            node, pos = child, pos + common
        if pos < len(query):
            page = pos // self._page_bytes
            new_values = list(values[page:pages]) if values is not None else None
            self._attach(node, query[pos:], new_values, now, tick)
        return pos // TOKEN_BYTES

    def lock(self, node: RadixNode[V]) -> None:
        """Protect ``node`` and its ancestors from eviction until a matching ``unlock``."""
        self._check_attached(node)
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= node.num_tokens
                self._protected += node.num_tokens
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode[V]) -> None:
        """Release one ``lock`` of ``node``."""
        self._check_attached(node)
        if node is not self._root and node.lock_ref == 0:
            raise ValueError("unlock of a radix node that is not locked")
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= node.num_tokens
                self._evictable += node.num_tokens
            node = node.parent

    def evict(self, num_tokens: int) -> list[V]:
        """Evict unlocked leaves, oldest first, until at least ``num_tokens`` are freed or none is left.

        Returns the evicted values; ``on_evict`` sees each evicted node first.
        """
        if num_tokens <= 0:
            return []
        order = self._last_access if self.policy == "lru" else self._insert_time
        return self._drain(order, lambda node: True, num_tokens, self._on_evict)

    def evict_expired(self, max_age_s: float) -> list[V]:
        """Evict unlocked leaves idle for ``max_age_s`` seconds or more, and parents that expire with them."""
        cutoff = self._clock() - max_age_s
        return self._drain(self._last_access, lambda node: node.last_access <= cutoff, None, self._on_evict)

    def clear(self) -> list[V]:
        """Drop every unlocked node and return its values; locked paths stay until unlocked.

        ``on_evict`` is not called: clearing discards, it does not offload.
        """
        return self._drain(self._insert_time, lambda node: True, None, None)

    @staticmethod
    def _last_access(node: RadixNode[V]) -> tuple[float, int]:
        return node.last_access, node.tick

    @staticmethod
    def _insert_time(node: RadixNode[V]) -> tuple[float, int]:
        return node.created

    def _drain(
        self,
        order: Callable[[RadixNode[V]], tuple[float, int]],
        eligible: Callable[[RadixNode[V]], bool],
        budget: int | None,
        on_evict: Callable[[EvictedSpan[V]], None] | None,
    ) -> list[V]:
        heap = [(order(n), n.serial, n) for n in self._leaves if n.lock_ref == 0 and eligible(n)]
        heapq.heapify(heap)
        freed, evicted = 0, []
        while heap and (budget is None or freed < budget):
            node = heapq.heappop(heap)[2]
            parent = self._detach(node, on_evict)
            freed += node.num_tokens
            if node.values is not None:
                evicted.extend(node.values)
            if parent in self._leaves and parent.lock_ref == 0 and eligible(parent):
                heapq.heappush(heap, (order(parent), parent.serial, parent))
        return evicted

    def _attach(
        self, parent: RadixNode[V], key: bytes, values: list[V] | None, now: float, tick: int
    ) -> RadixNode[V]:
        node = RadixNode(key, values, parent, now, tick, next(self._serials))
        self._leaves.discard(parent)
        parent.children[key[: self._page_bytes]] = node
        self._leaves.add(node)
        self._evictable += node.num_tokens
        self._nodes += 1
        return node

    def _split(self, node: RadixNode[V], at: int) -> RadixNode[V]:
        """Cut ``node``'s key at byte ``at``; a new parent takes the head, ``node`` keeps the tail."""
        parent = node.parent
        assert parent is not None
        page = at // self._page_bytes
        head_values = node.values[:page] if node.values is not None else None
        head = RadixNode(node.key[:at], head_values, parent, node.last_access, node.tick, next(self._serials))
        head.created = node.created
        head.lock_ref = node.lock_ref  # every lock on node also holds its ancestors
        parent.children[node.key[: self._page_bytes]] = head
        node.key = node.key[at:]
        node.values = node.values[page:] if node.values is not None else None
        node.parent = head
        head.children[node.key[: self._page_bytes]] = node
        self._nodes += 1
        return head

    def _detach(self, node: RadixNode[V], on_evict: Callable[[EvictedSpan[V]], None] | None) -> RadixNode[V]:
        parent = node.parent
        assert parent is not None
        if on_evict is not None:
            on_evict(self._span(node))
        del parent.children[node.key[: self._page_bytes]]
        self._leaves.discard(node)
        if parent is not self._root and not parent.children:
            self._leaves.add(parent)
        self._evictable -= node.num_tokens
        self._nodes -= 1
        node.parent = None
        return parent

    def _span(self, node: RadixNode[V]) -> EvictedSpan[V]:
        keys: list[bytes] = []
        cursor: RadixNode[V] | None = node
        while cursor is not None:
            keys.append(cursor.key)
            cursor = cursor.parent
        prefix = unpack_tokens(b"".join(reversed(keys)))
        values = list(node.values) if node.values is not None else []
        return EvictedSpan(prefix_tokens=prefix, start=len(prefix) - node.num_tokens, values=values)

    def _check_attached(self, node: RadixNode[V]) -> None:
        if node is not self._root and node.parent is None:
            raise ValueError("radix node was evicted; lock the node of a fresh match_prefix")
