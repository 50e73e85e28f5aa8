"""The in-process alert conditions of the cache tiers and the hit rate, and how `since` is kept."""

from __future__ import annotations

from cachelayer.stats import TierSnapshot
from proxy.cache.alerts import AlertBook, Condition, hit_rate_conditions, tier_conditions
from proxy.cache.counters import CacheMonitor


def tier(name: str, kind: str, held: int, capacity: int, errors: int = 0) -> TierSnapshot:
    return TierSnapshot(
        name=name, kind=kind, entries=1, bytes=held, capacity_bytes=capacity, hits=0, misses=0,
        queries=0, evictions=3, expirations=0, errors=errors, policy="lru", puts=0,
    )  # fmt: skip


def test_a_nearly_full_disk_tier_alerts_and_a_full_memory_tier_does_not() -> None:
    found = tier_conditions(
        [tier("l3", "disk", 99, 100), tier("kv_l3", "disk", 50, 100), tier("l1", "memory", 100, 100)]
    )
    assert [(c.name, c.severity, c.source) for c in found] == [
        ("RadixgateDiskTierNearCapacity", "info", "l3")
    ]


def test_tier_errors_alert() -> None:
    (found,) = tier_conditions([tier("redis", "redis", 0, 0, errors=2)])
    assert (found.name, found.source, found.message) == (
        "RadixgateCacheTierErrors",
        "redis",
        "2 failed calls so far, answered as misses",
    )


def _monitor(now: list[float]) -> CacheMonitor:
    return CacheMonitor(trend_interval_s=60, clock=lambda: now[0])


def _traffic(monitor: CacheMonitor, now: list[float], minutes: int, hits: int, misses: int) -> None:
    counters = monitor.tenant("t")
    for _ in range(minutes):
        now[0] += 60
        for _ in range(hits):
            monitor.count(counters, "hits")
        for _ in range(misses):
            monitor.count(counters, "misses")


def test_a_collapsing_hit_rate_alerts_and_a_steady_one_does_not() -> None:
    now = [1_000_000.0]
    steady = _monitor(now)
    _traffic(steady, now, 50, hits=5, misses=5)
    assert hit_rate_conditions(steady) == []

    now = [1_000_000.0]
    collapsing = _monitor(now)
    _traffic(collapsing, now, 40, hits=5, misses=5)
    _traffic(collapsing, now, 20, hits=0, misses=10)
    (found,) = hit_rate_conditions(collapsing)
    assert (found.name, found.severity) == ("RadixgateResponseCacheHitRateCollapse", "warning")
    assert found.message.startswith("hit rate 0% over the last 15 min")


def test_since_holds_while_a_condition_holds_and_resets_after_it_clears() -> None:
    now = [100.0]
    book = AlertBook(clock=lambda: now[0])
    down = Condition("RadixgateWorkerDown", "warning", "w0", "down")
    assert book.evaluate([down])[0].since == 100.0
    now[0] = 130.0
    assert book.evaluate([down])[0].since == 100.0
    assert book.evaluate([]) == []
    now[0] = 160.0
    assert book.evaluate([down])[0].since == 160.0
