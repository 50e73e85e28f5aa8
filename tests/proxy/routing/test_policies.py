"""The simple policies: round robin, random, power of two, least load, session hashing."""

from __future__ import annotations

import random

import pytest

from proxy.routing.config import CacheAwareSettings
from proxy.routing.policies import PowerOfTwo, RandomChoice, RoutingContext, Session
from proxy.routing.registry import build_policy
from tests.proxy.routing.conftest import completion_request, make_pool


async def test_round_robin_takes_turns() -> None:
    pool = make_pool(3, policy="round_robin")
    chosen = []
    for _ in range(6):
        lease = await pool.acquire(completion_request("x"))
        chosen.append(lease.worker_id)
        lease.release(usage=None, failed=False)
    assert chosen == ["w0", "w1", "w2", "w0", "w1", "w2"]


async def test_least_load_fills_the_emptiest_worker() -> None:
    pool = make_pool(3, policy="least_load")
    leases = [await pool.acquire(completion_request("x" * 400)) for _ in range(6)]
    counts = {w.id: w.in_flight for w in pool.workers()}
    assert counts == {"w0": 2, "w1": 2, "w2": 2}
    for lease in leases:
        lease.release(usage=None, failed=False)


async def test_power_of_two_prefers_the_less_loaded_of_its_pair() -> None:
    pool = make_pool(2)
    busy = pool.workers()[0]
    busy.queued_work = 1e6
    policy = PowerOfTwo(random.Random(1))
    context = RoutingContext(tokens=__import__("array").array("I"), expected_output=1)
    assert all(policy.choose(pool.workers(), context).worker.id == "w1" for _ in range(10))


async def test_random_respects_weights() -> None:
    pool = make_pool(2)
    heavy = pool.workers()[1]
    heavy.spec = heavy.spec.__class__(url=heavy.spec.url, id="w1", weight=9.0)
    policy = RandomChoice(random.Random(7))
    context = RoutingContext(tokens=__import__("array").array("I"), expected_output=1)
    picks = [policy.choose(pool.workers(), context).worker.id for _ in range(500)]
    assert picks.count("w1") > 3 * picks.count("w0")


async def test_session_keeps_a_user_on_one_worker_and_moves_few_users_when_one_leaves() -> None:
    pool = make_pool(4, policy="session")
    home = {}
    for user in range(40):
        lease = await pool.acquire(completion_request("x", user=f"user-{user}"))
        home[user] = lease.worker_id
        lease.release(usage=None, failed=False)
        again = await pool.acquire(completion_request("y", user=f"user-{user}"))
        assert again.worker_id == lease.worker_id
        again.release(usage=None, failed=False)
    assert len(set(home.values())) == 4
    pool.remove_worker("w0")
    moved = 0
    for user in range(40):
        lease = await pool.acquire(completion_request("x", user=f"user-{user}"))
        moved += lease.worker_id != home[user]
        lease.release(usage=None, failed=False)
    assert moved == sum(1 for worker in home.values() if worker == "w0")


def test_session_without_a_user_falls_back_to_least_load() -> None:
    pool = make_pool(2)
    pool.workers()[0].queued_work = 10.0
    decision = Session().choose(
        pool.workers(), RoutingContext(tokens=__import__("array").array("I"), expected_output=1)
    )
    assert (decision.worker.id, decision.reason) == ("w1", "no_session")


def test_unknown_policy_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="round_robin"):
        build_policy("fastest", CacheAwareSettings())
