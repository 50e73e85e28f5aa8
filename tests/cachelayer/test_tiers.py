"""The tiered store over memory tiers: budgets, promotion, demotion, write-through, TTLs, counters."""

from __future__ import annotations

import hashlib
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachelayer.memory import ENTRY_OVERHEAD_BYTES, MemoryTier, MemoryTierConfig
from cachelayer.policies import POLICY_NAMES
from cachelayer.tier import Entry
from cachelayer.tiers import StoreConfig, TieredStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def sized(n: int, tag: int = 0) -> bytes:
    """``n`` bytes that zstd cannot shrink, different per tag."""
    seed = tag.to_bytes(4, "little")
    out = b"".join(hashlib.sha256(seed + i.to_bytes(4, "little")).digest() for i in range(n // 32 + 1))
    return out[:n]


def store(
    l1: int, l2: int, *, write_policy: str = "write_back", clock: Clock | None = None, **kw: object
) -> TieredStore:
    config = StoreConfig(
        l1=MemoryTierConfig(name="l1", capacity_bytes=l1, policy=str(kw.get("policy", "lru"))),
        l2=MemoryTierConfig(name="l2", capacity_bytes=l2, compress=bool(kw.get("compress", False))),
        write_policy=write_policy,
    )
    return TieredStore.from_config(config, clock=clock or Clock())


def entry_bytes(key: bytes, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD_BYTES


def test_write_back_demotes_evictions_and_promotes_hits() -> None:
    cache = store(l1=2 * entry_bytes(b"k0", sized(100)), l2=10_000)
    for index in range(3):
        cache.put(b"k%d" % index, sized(100, index))
    l1, l2 = cache.stats().tiers
    assert (l1.entries, l1.evictions, l2.entries) == (2, 1, 1)  # k0 went down to L2
    assert (cache.locate(b"k0"), cache.locate(b"k2"), cache.locate(b"nope")) == ("l2", "l1", None)
    assert cache.stats().queries == 0  # locating reads nothing and counts nothing
    assert cache.get(b"k0") == sized(100, 0)
    l1, l2 = cache.stats().tiers
    assert (l2.hits, l1.entries) == (1, 2)  # promoted back up, pushing k1 down
    assert cache.get(b"k0") == sized(100, 0)
    assert cache.stats().tiers[0].hits == 1
    assert cache.get(b"k1") == sized(100, 1)


def test_write_through_fills_every_tier_and_drops_evictions() -> None:
    cache = store(l1=entry_bytes(b"k0", sized(100)), l2=10_000, write_policy="write_through")
    cache.put(b"k0", sized(100, 0))
    cache.put(b"k1", sized(100, 1))
    l1, l2 = cache.stats().tiers
    assert (l1.entries, l2.entries, l2.puts) == (1, 2, 2)
    assert cache.get(b"k0") == sized(100, 0)
    assert cache.stats().tiers[1].hits == 1


def test_value_too_big_for_l1_lands_in_l2_and_budget_holds() -> None:
    cache = store(l1=500, l2=10_000)
    cache.put(b"big", sized(2_000))
    l1, l2 = cache.stats().tiers
    assert (l1.entries, l2.entries) == (0, 1)
    assert cache.get(b"big") == sized(2_000)
    cache.put(b"huge", sized(20_000))  # fits nowhere: not stored at all
    assert cache.get(b"huge") is None


def test_ttl_expires_in_every_tier_and_survives_demotion() -> None:
    clock = Clock()
    cache = store(l1=entry_bytes(b"a", sized(100)), l2=10_000, clock=clock)
    cache.put(b"a", sized(100, 1), ttl_s=10)
    cache.put(b"b", sized(100, 2))  # pushes "a" down to L2 with its expiry
    clock.now += 9
    assert cache.get(b"a") == sized(100, 1)
    clock.now += 2
    assert cache.get(b"a") is None
    assert sum(tier.expirations for tier in cache.stats().tiers) >= 1
    ttl_cache = TieredStore([MemoryTier(MemoryTierConfig(), clock)], default_ttl_s=5, clock=clock)
    ttl_cache.put(b"x", b"1")
    clock.now += 6
    assert ttl_cache.get(b"x") is None


def test_newer_value_never_loses_to_an_older_copy_below() -> None:
    clock = Clock()
    cache = store(l1=entry_bytes(b"k", sized(100)), l2=10_000, clock=clock)
    cache.put(b"k", sized(100, 1))
    cache.put(b"other", sized(100, 9))  # old "k" now in L2
    cache.put(b"k", sized(100, 2), ttl_s=1)
    assert cache.get(b"k") == sized(100, 2)
    clock.now += 2
    assert cache.get(b"k") is None


def test_zstd_tier_holds_compressed_bytes() -> None:
    tier = MemoryTier(MemoryTierConfig(name="l2", capacity_bytes=1 << 20, compress=True))
    tier.put(b"k", Entry(data=b"abc" * 10_000, expires_at=None))
    assert (tier.stats().bytes or 0) < 1_000
    got = tier.get(b"k")
    assert got is not None and got.data == b"abc" * 10_000


def test_counters_and_validation() -> None:
    cache = store(l1=10_000, l2=10_000)
    cache.put(b"a", b"1")
    assert cache.get(b"a") == b"1"
    assert cache.get(b"b") is None
    snap = cache.stats()
    assert (snap.queries, snap.hits, snap.misses, snap.hit_rate) == (2, 1, 1, 0.5)
    assert [t.name for t in snap.tiers] == ["l1", "l2"] == cache.tier_names
    assert cache.delete(b"a") and not cache.delete(b"a")
    cache.put(b"c", b"3")
    cache.clear()
    assert cache.get(b"c") is None and all(t.entries == 0 for t in cache.stats().tiers)
    with pytest.raises(ValueError, match="write_policy"):
        store(10, 10, write_policy="write_around")
    with pytest.raises(ValueError, match="ttl_s"):
        cache.put(b"x", b"y", ttl_s=0)


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "get", "delete", "tick"]),
        st.integers(0, 12),
        st.integers(0, 900),
        st.one_of(st.none(), st.integers(1, 30)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    script=ops,
    policy=st.sampled_from(POLICY_NAMES),
    write_policy=st.sampled_from(["write_back", "write_through"]),
    compress=st.booleans(),
)
def test_budgets_hold_and_reads_are_never_stale(
    script: list[tuple[str, int, int, int | None]], policy: str, write_policy: str, compress: bool
) -> None:
    clock = Clock()
    cache = store(1_500, 4_000, write_policy=write_policy, clock=clock, policy=policy, compress=compress)
    latest: dict[bytes, tuple[bytes, float | None]] = {}  # what a read may return, and until when
    for step, (op, index, size, ttl) in enumerate(script):
        key = b"key%d" % index
        if op == "put":
            value = sized(size, step)
            cache.put(key, value, ttl_s=ttl)
            latest[key] = (value, None if ttl is None else clock.now + ttl)
            if entry_bytes(key, value) <= 1_500:
                assert cache.get(key) == value  # a fresh put that fits L1 is readable at once
        elif op == "get":
            got = cache.get(key)
            if got is not None:
                value, expires = latest[key]
                assert got == value
                assert expires is None or clock.now < expires
                if entry_bytes(key, got) <= 1_500:
                    assert cache.locate(key) == "l1"  # a hit is promoted to the top tier
        elif op == "delete":
            cache.delete(key)
            latest.pop(key, None)
            assert cache.get(key) is None
        else:
            clock.now += 5
        for tier in cache.stats().tiers:
            assert tier.bytes is not None and tier.capacity_bytes is not None
            assert tier.bytes <= tier.capacity_bytes


def test_concurrent_callers_keep_budgets() -> None:
    cache = store(5_000, 20_000, policy="adaptive", compress=True)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for index in range(300):
                key = b"k%d" % ((index * 7 + seed) % 40)
                if index % 3:
                    cache.put(key, sized(50 + index % 400, seed))
                else:
                    cache.get(key)
        except BaseException as exc:  # surfaced below; a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for tier in cache.stats().tiers:
        assert (
            tier.bytes is not None and tier.capacity_bytes is not None and tier.bytes <= tier.capacity_bytes
        )
