"""Conversation affinity through the pool: a hinted turn stays on its worker until load says no."""

from __future__ import annotations

import pytest

from adapters.base import RouteHint
from adapters.errors import EngineOverloaded
from tests.proxy.routing.conftest import chat_request, make_pool


async def test_a_hinted_turn_goes_to_its_worker_under_any_policy() -> None:
    pool = make_pool(4, policy="round_robin")
    for target in ("w2", "w0", "w3", "w3"):
        request = chat_request("system", "user")
        request.route = RouteHint(prefer_worker=target)
        lease = await pool.acquire(request)
        assert lease.worker_id == target
        assert request.route.served_by is None  # the forwarder records it, not the pool
        lease.release(usage=None, failed=False)


async def test_an_overloaded_worker_loses_the_turn_to_the_policy() -> None:
    # 2 workers, load_epsilon 0.5, one request elsewhere: home may hold 6 (the 7th would put 7 of 8
    # on it, above 1.5 x the mean of 4).
    pool = make_pool(2, policy="least_load", cache_aware={"load_epsilon": 0.5})
    home, other = pool.workers()
    elsewhere = chat_request("system", "user")
    elsewhere.route = RouteHint(prefer_worker=other.id)
    held = [await pool.acquire(elsewhere)]
    for _ in range(6):
        request = chat_request("system", "user")
        request.route = RouteHint(prefer_worker=home.id)
        held.append(await pool.acquire(request))
    assert [lease.worker_id for lease in held[1:]] == [home.id] * 6
    request = chat_request("system", "user")
    request.route = RouteHint(prefer_worker=home.id)
    moved = await pool.acquire(request)
    assert moved.worker_id != home.id


async def test_a_hinted_turn_never_leaves_a_worker_idle_while_its_own_is_above_the_mean() -> None:
    pool = make_pool(2, policy="least_load")
    home, other = pool.workers()
    held = []
    for _ in range(3):
        request = chat_request("system", "user")
        request.route = RouteHint(prefer_worker=home.id)
        held.append(await pool.acquire(request))
    # Two at home is the mean and a bit; the third would leave the other worker idle.
    assert [lease.worker_id for lease in held] == [home.id, home.id, other.id]


async def test_a_hint_naming_no_candidate_is_ignored() -> None:
    pool = make_pool(2)
    request = chat_request("system", "user")
    request.route = RouteHint(prefer_worker="gone")
    lease = await pool.acquire(request)
    assert lease.worker_id in {w.id for w in pool.workers()}


async def test_a_required_hint_holds_however_loaded_and_fails_without_its_worker() -> None:
    pool = make_pool(2, policy="least_load", cache_aware={"load_epsilon": 0.0})
    held = []
    for _ in range(3):
        request = chat_request("system", "user")
        request.route = RouteHint(prefer_worker="w0", required=True)
        held.append(await pool.acquire(request))
    assert {lease.worker_id for lease in held} == {"w0"}
    request = chat_request("system", "user")
    request.route = RouteHint(prefer_worker="gone", required=True)
    with pytest.raises(EngineOverloaded):
        await pool.acquire(request)
