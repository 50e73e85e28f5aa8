"""Eviction policies: the order each one promises, and bookkeeping that never loses or invents keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachelayer.policies import POLICY_NAMES, EvictionPolicy, make_policy


def drain(policy: EvictionPolicy) -> list[bytes]:
    order = []
    while (key := policy.pop_victim()) is not None:
        order.append(key)
    return order


def fill(name: str, keys: list[bytes]) -> EvictionPolicy:
    policy = make_policy(name)
    for key in keys:
        policy.insert(key, 100, 1.0)
    return policy


def test_lru_fifo_lfu_orders() -> None:
    lru = fill("lru", [b"a", b"b", b"c"])
    lru.touch(b"a")
    assert drain(lru) == [b"b", b"c", b"a"]
    fifo = fill("fifo", [b"a", b"b", b"c"])
    fifo.touch(b"a")
    assert drain(fifo) == [b"a", b"b", b"c"]
    lfu = fill("lfu", [b"a", b"b", b"c"])
    for key in (b"a", b"a", b"c"):
        lfu.touch(key)
    assert drain(lfu) == [b"b", b"c", b"a"]


def test_adaptive_weighs_frequency_size_cost_and_age() -> None:
    policy = make_policy("adaptive")
    policy.insert(b"big", 10_000, 1.0)
    policy.insert(b"small", 100, 1.0)
    policy.insert(b"costly", 10_000, 1_000.0)
    assert policy.pop_victim() == b"big"  # lowest cost per byte goes first
    policy.insert(b"hot", 100, 1.0)
    for _ in range(5):
        policy.touch(b"hot")
    assert policy.pop_victim() == b"small"  # same size and cost, fewer hits
    # Aging: each eviction raises the floor, so once-hot entries lose to a stream of fresh, touched ones
    # (under plain LFU "hot", with six hits, would outlive every one-hit filler).
    victims = []
    for index in range(50):
        policy.insert(b"filler%d" % index, 100, 1.0)
        policy.touch(b"filler%d" % index)
        victims.append(policy.pop_victim())
    assert b"hot" in victims
    assert b"filler49" not in victims


def test_unknown_policy_name() -> None:
    with pytest.raises(ValueError, match="unknown eviction policy 'mru'"):
        make_policy("mru")


ops = st.lists(
    st.tuples(st.sampled_from(["insert", "touch", "remove", "pop"]), st.integers(0, 9), st.integers(1, 500)),
    max_size=80,
)


@pytest.mark.parametrize("name", POLICY_NAMES)
@given(script=ops)
def test_victims_are_exactly_the_live_keys(name: str, script: list[tuple[str, int, int]]) -> None:
    policy = make_policy(name)
    live: set[bytes] = set()
    for op, index, size in script:
        key = b"k%d" % index
        if op == "insert" and key not in live:
            policy.insert(key, size, float(size % 7 + 1))
            live.add(key)
        elif op == "touch" and key in live:
            policy.touch(key)
        elif op == "remove":
            policy.remove(key)
            live.discard(key)
        elif op == "pop":
            victim = policy.pop_victim()
            assert (victim is None) == (not live)
            if victim is not None:
                assert victim in live
                live.remove(victim)
    rest = drain(policy)
    assert sorted(rest) == sorted(live)
