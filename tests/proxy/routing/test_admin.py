"""The worker admin API over a pool of fake engines."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from proxy.errors import EXCEPTION_HANDLERS
from proxy.routing.admin import admin_router
from proxy.routing.pool import WorkerPool
from tests.proxy.routing.conftest import chat_request, make_pool


@pytest.fixture
async def client_and_pool() -> AsyncIterator[tuple[AsyncTestClient[Litestar], WorkerPool]]:
    pool = make_pool(2)
    await pool.health.check_all()
    app = Litestar(route_handlers=[admin_router(pool)], exception_handlers=EXCEPTION_HANDLERS)
    async with AsyncTestClient(app) as client:
        yield client, pool
    await pool.aclose()


async def test_list_shows_health_load_tree_and_tokenizer(client_and_pool) -> None:  # type: ignore[no-untyped-def]
    client, pool = client_and_pool
    lease = await pool.acquire(chat_request("system " * 50, "q"))
    body = (await client.get("/admin/workers")).json()
    assert body["policy"] == "cache_aware"
    row = next(w for w in body["workers"] if w["id"] == lease.worker_id)
    assert row["health"] == "up" and row["circuit"] == "closed" and row["in_flight"] == 1
    assert row["tree_tokens"] > 0 and row["tree_memory_bytes"] > row["tree_tokens"]
    assert row["tokenizers"] == {"m": "bytes"}
    lease.release(usage=None, failed=False)


async def test_add_then_remove_a_worker(client_and_pool) -> None:  # type: ignore[no-untyped-def]
    client, pool = client_and_pool
    created = await client.post(
        "/admin/workers", json={"url": "http://127.0.0.1:9500", "kind": "sglang", "id": "x"}
    )
    assert created.status_code == 201 and created.json()["health"] == "up"
    duplicate = await client.post("/admin/workers", json={"url": "http://127.0.0.1:9501", "id": "x"})
    assert duplicate.status_code == 409 and duplicate.json()["error"]["param"] == "id"
    removed = await client.delete("/admin/workers/x")
    assert removed.status_code == 200 and removed.json()["state"] == "removed"
    assert [w.id for w in pool.workers()] == ["w0", "w1"]


async def test_removing_a_busy_worker_answers_202_draining(client_and_pool) -> None:  # type: ignore[no-untyped-def]
    client, pool = client_and_pool
    lease = await pool.acquire(chat_request("s", "q"))
    answer = await client.delete(f"/admin/workers/{lease.worker_id}")
    assert answer.status_code == 202 and answer.json() == {
        "id": lease.worker_id,
        "state": "draining",
        "in_flight": 1,
    }
    lease.release(usage=None, failed=False)
    assert lease.worker_id not in [w.id for w in pool.workers()]


async def test_errors_are_openai_shaped(client_and_pool) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_pool
    missing = await client.delete("/admin/workers/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "worker_not_found"
    bad = await client.post("/admin/workers", json={"url": "ftp://x", "kind": "openai"})
    assert bad.status_code == 400 and "error" in bad.json()


async def test_a_run_time_worker_s_kv_event_sockets_must_be_on_a_permitted_host(client_and_pool) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_pool
    elsewhere = {
        "url": "http://127.0.0.1:9300",
        "kind": "vllm",
        "id": "evented",
        "kv_events": {"endpoint": "tcp://10.9.9.9:5557"},
    }
    refused = await client.post("/admin/workers", json=elsewhere)
    assert refused.status_code == 403 and refused.json()["error"]["param"] == "kv_events"
    local_file = {**elsewhere, "kv_events": {"endpoint": "ipc:///tmp/engine-events"}}
    assert (await client.post("/admin/workers", json=local_file)).status_code == 403
    loopback = {**elsewhere, "kv_events": {"endpoint": "tcp://127.0.0.1:5557"}}
    added = await client.post("/admin/workers", json=loopback)
    assert added.status_code == 201 and added.json()["kv_events"]["live"] is False
    assert (await client.delete("/admin/workers/evented")).status_code == 200
