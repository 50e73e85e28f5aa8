"""Radix tree: unit tests, then a hypothesis state machine checked against a brute-force model."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cachelayer.radix import EvictedSpan, RadixNode, RadixTree

V = TypeVar("V")


class FakeClock:
    """A clock that advances one second per reading, so every operation has its own time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def path_tokens(node: RadixNode[V]) -> tuple[int, ...]:
    parts: list[tuple[int, ...]] = []
    cursor: RadixNode[V] | None = node
    while cursor is not None:
        parts.append(cursor.tokens)
        cursor = cursor.parent
    return tuple(t for part in reversed(parts) for t in part)


def walk(node: RadixNode[V]) -> Iterator[RadixNode[V]]:
    for child in node.children.values():
        yield child
        yield from walk(child)


def test_insert_and_match_return_page_aligned_lengths() -> None:
    tree: RadixTree[str] = RadixTree(page_size=4)
    assert tree.insert(list(range(10)), ["p0", "p1", "p2"]) == 0  # two whole pages kept, third page ignored
    assert tree.total_tokens == 8
    match = tree.match_prefix(list(range(7)))
    assert (match.length, match.values) == (4, ["p0"])
    assert tree.match_prefix([9, 9, 9, 9]).length == 0
    assert tree.match_prefix([9]).node is tree.root
    assert tree.insert(list(range(12)), ["x0", "x1", "p2"]) == 8  # caller frees its duplicates x0, x1
    assert tree.match_prefix(list(range(12))).values == ["p0", "p1", "p2"]


def test_insert_splits_on_divergence_but_match_splits_nothing() -> None:
    tree: RadixTree[int] = RadixTree()
    tree.insert([1, 2, 3, 4], [10, 20, 30, 40])
    match = tree.match_prefix([1, 2, 9])
    assert (match.length, match.values, tree.node_count) == (2, [10, 20], 1)
    assert tree.insert([1, 2, 3], [0, 0, 0]) == 3  # ends inside a node: nothing to add, nothing split
    assert tree.node_count == 1
    assert tree.insert([1, 2, 5, 6], [0, 0, 50, 60]) == 2
    assert tree.node_count == 3
    assert tree.match_prefix([1, 2, 3, 4]).values == [10, 20, 30, 40]
    assert tree.match_prefix([1, 2, 5, 6, 7]).values == [10, 20, 50, 60]
    assert tree.total_tokens == tree.evictable_tokens == 6


def test_long_keys_find_mismatch_anywhere() -> None:
    base = list(range(5000))
    for cut in (0, 1, 63, 64, 65, 700, 4095, 4999):
        tree: RadixTree[int] = RadixTree(page_size=2)
        tree.insert(base)
        query = [*base[:cut], 999_999, *base[cut + 1 :]]
        assert tree.match_prefix(query).length == cut - cut % 2
        assert tree.insert(query) == cut - cut % 2


def test_lock_protects_matched_pages_across_a_split() -> None:
    tree: RadixTree[int] = RadixTree()
    tree.insert([1, 2, 3, 4], [1, 2, 3, 4])
    match = tree.match_prefix([1, 2])  # ends inside the node: locking it protects pages 1 and 2
    tree.lock(match.node)
    assert (tree.protected_tokens, tree.evictable_tokens) == (4, 0)
    tree.insert([1, 2, 7], [1, 2, 7])  # splits the locked node under the lock
    assert (tree.protected_tokens, tree.evictable_tokens) == (4, 1)
    assert tree.evict(100) == [7]
    assert tree.match_prefix([1, 2, 3, 4]).length == 4
    tree.unlock(match.node)
    assert (tree.protected_tokens, tree.evictable_tokens) == (0, 4)
    assert sorted(tree.evict(100)) == [1, 2, 3, 4]
    assert (tree.total_tokens, tree.node_count) == (0, 0)


def test_lru_evicts_least_recently_matched_and_parents_become_leaves() -> None:
    tree: RadixTree[str] = RadixTree(clock=FakeClock())
    tree.insert([1, 2], ["a1", "a2"])
    tree.insert([1, 2, 3], ["a1", "a2", "b3"])
    tree.insert([5], ["c5"])
    tree.match_prefix([1, 2, 3])
    assert tree.evict(1) == ["c5"]
    assert tree.evict(2) == ["b3", "a1", "a2"]  # the parent became a leaf and went too
    assert tree.node_count == 0


def test_fifo_evicts_oldest_insert_even_if_recently_matched() -> None:
    tree: RadixTree[str] = RadixTree(policy="fifo", clock=FakeClock())
    tree.insert([1], ["a"])
    tree.insert([2], ["b"])
    tree.match_prefix([1])
    assert tree.evict(1) == ["a"]


def test_on_evict_sees_full_prefix_and_node_span() -> None:
    spans: list[EvictedSpan[str]] = []
    tree: RadixTree[str] = RadixTree(page_size=2, on_evict=spans.append)
    tree.insert([1, 2, 3, 4], ["p", "q"])
    tree.insert([1, 2, 5, 6, 7, 8], ["p", "r", "s"])
    tree.lock(tree.match_prefix([1, 2, 3, 4]).node)
    assert tree.evict(1) == ["r", "s"]
    assert spans == [EvictedSpan(prefix_tokens=(1, 2, 5, 6, 7, 8), start=2, values=["r", "s"])]


def test_evict_expired_drops_idle_leaves_and_their_idle_parents() -> None:
    clock = FakeClock()
    tree: RadixTree[None] = RadixTree(clock=clock)
    tree.insert([1, 2])  # t=1
    tree.insert([1, 2, 3])  # t=2
    tree.insert([7])  # t=3
    clock.now = 10.0
    tree.match_prefix([7])  # t=11
    tree.evict_expired(5.0)  # t=12: everything last touched at t <= 7 goes
    assert (tree.total_tokens, tree.node_count) == (1, 1)
    assert tree.match_prefix([7]).length == 1


def test_clear_returns_unlocked_values_and_keeps_locked_paths() -> None:
    tree: RadixTree[int] = RadixTree()
    tree.insert([1, 2], [1, 2])
    tree.insert([3], [3])
    tree.lock(tree.match_prefix([1, 2]).node)
    assert tree.clear() == [3]
    assert tree.total_tokens == tree.protected_tokens == 2


def test_presence_tree_and_array_input() -> None:
    tree: RadixTree[None] = RadixTree()
    assert tree.insert(array("I", [4, 5, 6])) == 0
    match = tree.match_prefix(array("I", [4, 5]))
    assert (match.length, match.values) == (2, [])
    assert tree.evict(1) == []
    assert tree.total_tokens == 0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: RadixTree(page_size=0), "page_size"),
        (lambda: RadixTree(policy="lfu"), "policy"),
        (lambda: RadixTree[int]().insert([1, 2], [1]), "values"),
        (lambda: RadixTree[None]().insert([-1]), "token ids"),
    ],
)
def test_bad_arguments_raise_value_error(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_misuse_of_values_and_locks_is_rejected() -> None:
    tree: RadixTree[int] = RadixTree()
    tree.insert([1], [1])
    with pytest.raises(ValueError, match="stores one value"):
        tree.insert([2])
    node = tree.match_prefix([1]).node
    with pytest.raises(ValueError, match="not locked"):
        tree.unlock(node)
    tree.evict(1)
    with pytest.raises(ValueError, match="evicted"):
        tree.lock(node)


# (which earlier sequence to reuse, how much of it, what follows): queries that share prefixes often
query_st = st.tuples(st.integers(0, 1000), st.integers(0, 14), st.lists(st.integers(0, 3), max_size=6))


class RadixModel(RuleBasedStateMachine):
    """The tree against a brute-force set of every cached page-aligned prefix."""

    @initialize(page_size=st.integers(1, 3), policy=st.sampled_from(["lru", "fifo"]))
    def setup(self, page_size: int, policy: str) -> None:
        self.page = page_size
        self.clock = FakeClock()
        self.spans: list[EvictedSpan[tuple[int, ...]]] = []
        self.tree: RadixTree[tuple[int, ...]] = RadixTree(page_size, policy, self.clock, self.spans.append)
        self.prefixes: set[tuple[int, ...]] = set()  # every cached prefix, one per page
        self.locks: list[RadixNode[tuple[int, ...]]] = []
        self.seen: list[list[int]] = []

    def query(self, spec: tuple[int, int, list[int]]) -> list[int]:
        pick, cut, tail = spec
        head = self.seen[pick % len(self.seen)][:cut] if self.seen else []
        return head + tail

    def aligned(self, tokens: list[int]) -> tuple[int, ...]:
        return tuple(tokens[: len(tokens) - len(tokens) % self.page])

    def longest(self, tokens: list[int]) -> int:
        best = 0
        for end in range(self.page, len(tokens) + 1, self.page):
            if tuple(tokens[:end]) not in self.prefixes:
                break
            best = end
        return best

    def order(self, node: RadixNode[tuple[int, ...]]) -> tuple[float, int]:
        return (node.last_access, node.tick) if self.tree.policy == "lru" else node.created

    @rule(spec=query_st)
    def insert(self, spec: tuple[int, int, list[int]]) -> None:
        tokens = self.query(spec)
        self.seen.append(tokens)
        seq = self.aligned(tokens)
        # each page's value is its own full prefix, so a returned value shows exactly which page it is
        values = [seq[: end + self.page] for end in range(0, len(seq), self.page)]
        assert self.tree.insert(tokens, values) == self.longest(tokens)
        self.prefixes.update(values)

    @rule(spec=query_st)
    def match(self, spec: tuple[int, int, list[int]]) -> None:
        tokens = self.query(spec)
        result = self.tree.match_prefix(tokens)
        assert result.length == self.longest(tokens)
        assert result.values == [
            tuple(tokens[: end + self.page]) for end in range(0, result.length, self.page)
        ]
        assert path_tokens(result.node)[: result.length] == tuple(tokens[: result.length])

    @rule(spec=query_st)
    def lock(self, spec: tuple[int, int, list[int]]) -> None:
        node = self.tree.match_prefix(self.query(spec)).node
        self.tree.lock(node)
        self.locks.append(node)

    @precondition(lambda self: self.locks)
    @rule(index=st.integers(0, 100))
    def unlock(self, index: int) -> None:
        self.tree.unlock(self.locks.pop(index % len(self.locks)))

    @rule(num_tokens=st.integers(0, 12))
    def evict(self, num_tokens: int) -> None:
        before = set(walk(self.tree.root))
        first_candidates = {node for node in before if not node.children and node.lock_ref == 0}
        candidates_left = self.drop(self.tree.evict(num_tokens), before)
        gone = before - set(walk(self.tree.root))
        freed = sum(node.num_tokens for node in gone)
        assert freed >= num_tokens or not candidates_left
        assert len(self.spans) == len(gone)
        if gone:
            last = self.spans[-1]
            assert freed - (len(last.prefix_tokens) - last.start) < num_tokens  # stops once enough is freed
            latest = max(self.order(node) for node in gone)
            assert all(latest <= self.order(node) for node in candidates_left if node in first_candidates)
        self.spans.clear()

    @rule(max_age=st.integers(0, 20))
    def evict_expired(self, max_age: int) -> None:
        before = set(walk(self.tree.root))
        candidates_left = self.drop(self.tree.evict_expired(max_age), before)
        self.spans.clear()
        cutoff = self.clock.now - max_age
        assert all(node.last_access <= cutoff for node in before - set(walk(self.tree.root)))
        assert all(node.last_access > cutoff for node in candidates_left)

    @rule()
    def clear(self) -> None:
        before = set(walk(self.tree.root))
        evicted = self.tree.clear()
        assert not self.spans  # clearing discards without offloading
        self.drop(evicted, before)
        assert self.tree.evictable_tokens == 0

    def drop(
        self, evicted: list[tuple[int, ...]], before: set[RadixNode[tuple[int, ...]]]
    ) -> list[RadixNode[tuple[int, ...]]]:
        """Apply an eviction to the model; returns the unlocked leaves still evictable."""
        after = set(walk(self.tree.root))
        assert after <= before
        for node in self.locks:
            assert (
                node is self.tree.root or node in after
            )  # locked nodes and their ancestors are never evicted
        paths = [path_tokens(node) for node in after]
        cached = {path[:end] for path in paths for end in range(self.page, len(path) + 1, self.page)}
        assert cached <= self.prefixes
        assert sorted(evicted) == sorted(self.prefixes - cached)
        for span in self.spans:  # values are full prefixes, so they pin down prefix_tokens and start
            pages = range(span.start + self.page, len(span.prefix_tokens) + 1, self.page)
            assert span.values == [span.prefix_tokens[:end] for end in pages]
        self.prefixes = cached
        return [node for node in after if not node.children and node.lock_ref == 0]

    @invariant()
    def sizes_agree(self) -> None:
        tree = self.tree
        assert (
            tree.evictable_tokens + tree.protected_tokens
            == tree.total_tokens
            == len(self.prefixes) * self.page
        )
        protected = {path_tokens(node) for node in self.locks}
        protected_pages = {p[:end] for p in protected for end in range(self.page, len(p) + 1, self.page)}
        assert tree.protected_tokens == len(protected_pages) * self.page
        assert tree.node_count == len(list(walk(tree.root)))


TestRadixModel = RadixModel.TestCase
TestRadixModel.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_a_match_without_touch_leaves_the_lru_order_alone() -> None:
    tree: RadixTree[None] = RadixTree(clock=FakeClock())
    tree.insert([1, 2])
    tree.insert([5, 6])
    assert tree.match_prefix([1, 2, 3], touch=False).length == 2
    tree.evict(1)
    assert tree.match_prefix([1, 2]).length == 0  # still the least recently used: evicted
    assert tree.match_prefix([5, 6]).length == 2
