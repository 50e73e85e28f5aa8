"""The worker pool: exclusion, breakers, health checks, capacity, drain and run-time membership."""

from __future__ import annotations

import asyncio

import pytest

from adapters.engine_metrics import EngineLoad
from adapters.errors import EngineError, EngineOverloaded
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.routing.pool import WorkerPool
from tests.proxy.routing.conftest import FakeEngine, chat_request, completion_request, make_pool


def engine_of(pool, worker_id: str) -> FakeEngine:  # type: ignore[no-untyped-def]
    return next(w.engine for w in pool.workers() if w.id == worker_id)


async def test_a_retry_skips_the_workers_that_failed_the_request() -> None:
    pool = make_pool(2, policy="round_robin")
    first = await pool.acquire(completion_request("x"))
    first.release(usage=None, failed=True)
    retry = await pool.acquire(completion_request("x"), exclude=frozenset({first.worker_id}))
    assert retry.worker_id != first.worker_id
    with pytest.raises(EngineOverloaded):
        await pool.acquire(completion_request("x"), exclude=frozenset({"w0", "w1"}))


async def test_the_breaker_opens_after_consecutive_failures_and_closes_after_a_good_trial() -> None:
    now = [0.0]
    pool = make_pool(2, policy="round_robin", breaker={"failure_threshold": 2, "cooldown_s": 5.0})
    for worker in pool.workers():
        worker.breaker.clock = lambda: now[0]
    for _ in range(2):
        lease = await pool.acquire(completion_request("x"), exclude=frozenset({"w1"}))
        lease.release(usage=None, failed=True)
    assert pool.component_states()["w0"] == "degraded"
    for _ in range(3):  # open: every request goes to w1
        lease = await pool.acquire(completion_request("x"))
        assert lease.worker_id == "w1"
        lease.release(usage=None, failed=False)
    now[0] = 6.0  # cooldown over: one trial request may reach w0
    trial = await pool.acquire(completion_request("x"), exclude=frozenset({"w1"}))
    assert trial.worker_id == "w0"
    for _ in range(2):  # only one trial at a time: meanwhile w1 takes the rest
        lease = await pool.acquire(completion_request("x"))
        assert lease.worker_id == "w1"
        lease.release(usage=None, failed=False)
    trial.release(usage=None, failed=False)
    worker = next(w for w in pool.workers() if w.id == "w0")
    assert worker.breaker.state == "closed"


async def test_health_checks_take_a_down_worker_out_and_bring_it_back() -> None:
    pool = make_pool(2, policy="round_robin", health_failure_threshold=2, health_success_threshold=2)
    await pool.health.check_all()
    assert pool.readiness() == {"m": True}
    engine_of(pool, "w0").healthy = False
    await pool.health.check_all()
    assert pool.component_states()["w0"] == "operational"  # one failure is below the threshold
    await pool.health.check_all()
    assert pool.component_states()["w0"] == "down"
    for _ in range(4):
        lease = await pool.acquire(completion_request("x"))
        assert lease.worker_id == "w1"
        lease.release(usage=None, failed=False)
    engine_of(pool, "w0").healthy = True
    await pool.health.check_all()
    assert pool.component_states()["w0"] == "down"
    await pool.health.check_all()
    assert pool.component_states()["w0"] == "operational"


async def test_readiness_needs_a_healthy_worker_per_model() -> None:
    pool = make_pool(1, health_failure_threshold=1)
    engine_of(pool, "w0").healthy = False
    await pool.health.check_all()
    assert pool.readiness() == {"m": False}
    # Panic mode: the one worker is still tried, once per request (a retry finds none left).
    lease = await pool.acquire(completion_request("x"))
    assert lease.worker_id == "w0"
    with pytest.raises(EngineOverloaded):
        await pool.acquire(completion_request("x"), exclude=frozenset({"w0"}))
    lease.release(usage=None, failed=True)


async def test_when_every_worker_is_down_the_most_recently_healthy_one_is_tried() -> None:
    pool = make_pool(3, health_failure_threshold=1)
    await pool.health.check_all()
    for worker_id in ("w2", "w0", "w1"):  # one by one; w1 passes its checks the longest
        engine_of(pool, worker_id).healthy = False
        await pool.health.check_all()
    assert pool.readiness() == {"m": False}
    assert pool.panicking() == {"m": "w1"}
    assert pool.component_states() == {"w0": "down", "w1": "down", "w2": "down", "panic:m": "degraded"}
    lease = await pool.acquire(completion_request("x"))
    assert lease.worker_id == "w1"
    lease.release(usage=None, failed=True)
    retry = await pool.acquire(completion_request("x"), exclude=frozenset({"w1"}))
    assert retry.worker_id == "w0"  # next most recently healthy
    # It answered: a health check runs at once, and the worker is back in rotation.
    engine_of(pool, "w0").healthy = True
    retry.release(usage=None, failed=False)
    await asyncio.sleep(0.01)
    assert pool.component_states()["w0"] == "operational" and pool.panicking() == {}
    await pool.aclose()


async def test_no_panic_while_a_worker_is_up_but_at_its_limit() -> None:
    specs = [WorkerSpec(url="http://127.0.0.1:9100", id="w0", models=["m"], max_concurrency=1)]
    specs.append(WorkerSpec(url="http://127.0.0.1:9101", id="w1", models=["m"]))
    pool = WorkerPool(["m"], specs, RoutingSettings(health_failure_threshold=1), engine_factory=FakeEngine)
    engine_of(pool, "w1").healthy = False
    await pool.health.check_all()
    held = await pool.acquire(completion_request("x"))
    with pytest.raises(EngineOverloaded):  # w0 is busy, not down: w1 (down) is not tried
        await pool.acquire(completion_request("x"))
    held.release(usage=None, failed=False)


class MetricsBehindAProxy(FakeEngine):
    """Health answers 200, but the load metrics cannot be read (a proxy in front, metrics off)."""

    async def load(self) -> EngineLoad:
        raise EngineError("GET /metrics: 404")


async def test_unreadable_load_metrics_never_mark_a_healthy_worker_down() -> None:
    specs = [WorkerSpec(url="http://127.0.0.1:9100", id="w0", models=["m"])]
    pool = WorkerPool(
        ["m"], specs, RoutingSettings(health_failure_threshold=1), engine_factory=MetricsBehindAProxy
    )
    for _ in range(3):
        await pool.health.check_all()
    assert pool.component_states() == {"w0": "operational"} and pool.readiness() == {"m": True}
    assert next(iter(pool.workers())).engine_load == {}
    await pool.aclose()


async def test_the_engine_reported_capacity_sizes_the_tree() -> None:
    pool = make_pool(1)
    engine_of(pool, "w0").capacity = 5000
    await pool.health.check_all()
    worker = pool.workers()[0]
    assert (worker.capacity_tokens, worker.capacity_source) == (5000, "engine")


async def test_a_removed_worker_drains_then_closes() -> None:
    pool = make_pool(2, policy="round_robin")
    held = await pool.acquire(completion_request("x"), exclude=frozenset({"w1"}))
    result = pool.remove_worker("w0")
    assert (result.state, result.in_flight) == ("draining", 1)
    for _ in range(3):
        lease = await pool.acquire(completion_request("x"))
        assert lease.worker_id == "w1"
        lease.release(usage=None, failed=False)
    engine = held.engine
    held.release(usage=None, failed=False)
    assert [w.id for w in pool.workers()] == ["w1"]
    await pool.aclose()
    assert isinstance(engine, FakeEngine) and engine.closed


async def test_an_idle_worker_is_removed_at_once_and_ids_are_unique() -> None:
    pool = make_pool(1)
    assert pool.remove_worker("w0").state == "removed"
    await pool.add_worker(WorkerSpec(url="http://127.0.0.1:9100", id="new", models=["m"]))
    with pytest.raises(ValueError, match="already in the pool"):
        await pool.add_worker(WorkerSpec(url="http://127.0.0.1:9101", id="new"))
    with pytest.raises(KeyError):
        pool.remove_worker("missing")


async def test_max_concurrency_is_a_hard_limit_per_worker() -> None:
    pool = make_pool(0)
    await pool.add_worker(
        WorkerSpec(url="http://127.0.0.1:9100", id="small", models=["m"], max_concurrency=1)
    )
    lease = await pool.acquire(chat_request("s", "q"))
    with pytest.raises(EngineOverloaded):
        await pool.acquire(chat_request("s", "q"))
    lease.release(usage=None, failed=False)
    (await pool.acquire(chat_request("s", "q"))).release(usage=None, failed=False)


async def test_release_is_idempotent() -> None:
    pool = make_pool(1)
    lease = await pool.acquire(chat_request("s", "q"))
    lease.release(usage=None, failed=False)
    lease.release(usage=None, failed=True)
    worker = pool.workers()[0]
    assert (worker.in_flight, worker.failures, worker.queued_work) == (0, 0, 0.0)


async def test_when_every_circuit_is_open_live_workers_still_get_requests() -> None:
    pool = make_pool(1, breaker={"failure_threshold": 1, "cooldown_s": 60.0})
    lease = await pool.acquire(completion_request("x"))
    lease.release(usage=None, failed=True)
    assert pool.workers()[0].breaker.state == "open"
    # Refusing everything would turn one worker's hiccup into an outage: the live worker is tried.
    again = await pool.acquire(completion_request("x"))
    assert again.worker_id == "w0"
