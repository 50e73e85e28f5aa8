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
    # With 2 workers and load_epsilon 0.5 a worker may hold ceil(0.75 * (N + 1)) of N in flight:
    # three at home, none elsewhere, is its bound.
    pool = make_pool(2, policy="least_load", cache_aware={"load_epsilon": 0.5})
    home = pool.workers()[0]
    held = []
    for _ in range(3):
        request = chat_request("system", "user")
        request.route = RouteHint(prefer_worker=home.id)
        held.append(await pool.acquire(request))
    assert {lease.worker_id for lease in held} == {home.id}
    request = chat_request("system", "user")
    request.route = RouteHint(prefer_worker=home.id)
    moved = await pool.acquire(request)
    assert moved.worker_id != home.id


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
