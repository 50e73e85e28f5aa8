"""Exact KV-event routing against a simulated engine publishing vLLM's wire format over ZMQ."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from benchmarks.routing.kv_publisher import Encoding, KvEventPublisher
from benchmarks.routing.workload import word, write_word_tokenizer
from proxy.routing.admin import worker_status
from proxy.routing.config import KvEventsSpec, RoutingSettings, WorkerSpec
from proxy.routing.kv_wire import BlocksRemoved, BlocksStored, decode_batch
from proxy.routing.launch import free_port
from proxy.routing.pool import WorkerPool
from proxy.routing.worker import Worker
from tests.proxy.routing.conftest import FakeEngine, chat_request

BLOCK = 16
SYSTEM = " ".join(word(i % 50) for i in range(160))  # 160 vocabulary words: 160 tokens
OTHER = " ".join(word(100 + i) for i in range(40))
FRESH = " ".join(word(300 + i) for i in range(40))


class Cluster:
    def __init__(self, pool: WorkerPool, publishers: list[KvEventPublisher]) -> None:
        self.pool = pool
        self.publishers = publishers

    def worker(self, index: int) -> Worker:
        return self.pool.workers()[index]

    async def tokens(self, system: str, user: str, salt: str = "") -> list[int]:
        """The engine's token ids of the request (the pool's exact tokens, salt token removed)."""
        ids, kind = await self.pool.prompts.tokens(chat_request(system, user, salt=salt), [])
        assert kind == "tokenizer.json"
        engine_ids = list(ids[1:] if salt else ids)
        assert engine_ids.count(0) < 10  # vocabulary words, not unknowns
        return engine_ids

    async def settle(self, predicate: object, timeout_s: float = 3.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not predicate():  # type: ignore[operator]
            assert asyncio.get_running_loop().time() < deadline, "events not applied in time"
            await asyncio.sleep(0.01)


async def _cluster(tmp_path: Path, *, replay: bool, encoding: Encoding, stale_s: float) -> Cluster:
    publishers, specs = [], []
    for i in range(2):
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        replay_endpoint = f"tcp://127.0.0.1:{free_port()}" if replay else None
        publisher = KvEventPublisher(endpoint, replay_endpoint, block_size=BLOCK, encoding=encoding)
        publisher.start()
        publishers.append(publisher)
        events = KvEventsSpec(endpoint=endpoint, replay_endpoint=replay_endpoint, stale_after_s=stale_s)
        specs.append(
            WorkerSpec(url=f"http://127.0.0.1:{9200 + i}", id=f"w{i}", models=["m"], kv_events=events)
        )
    tokenizer = write_word_tokenizer(tmp_path / "tokenizer.json")
    settings = msgspec.convert({"tokenizers": {"m": str(tokenizer)}}, RoutingSettings)
    pool = WorkerPool(["m"], specs, settings, engine_factory=FakeEngine)
    await pool.start()
    cluster = Cluster(pool, publishers)
    # A subscriber that has just connected misses what was published before (ZMQ's slow joiner):
    # publish a probe until both feeds have seen one, as a real engine keeps publishing.
    for index, publisher in enumerate(publishers):
        feed = cluster.worker(index).kv_events
        assert feed is not None
        while feed.streams[0].last_seq is None:
            await publisher.clear()
            await asyncio.sleep(0.02)
    return cluster


@pytest.fixture(params=["array", "map"])
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    built = await _cluster(tmp_path, replay=True, encoding=request.param, stale_s=5.0)
    yield built
    await built.pool.aclose()
    for publisher in built.publishers:
        await publisher.close()


async def test_a_request_goes_where_the_engine_reports_its_blocks(cluster: Cluster) -> None:
    tokens = await cluster.tokens(SYSTEM, "first question")
    await cluster.publishers[1].store(tokens)
    feed = cluster.worker(1).kv_events
    assert feed is not None
    await cluster.settle(lambda: feed.blocks == len(tokens) // BLOCK)
    lease = await cluster.pool.acquire(chat_request(SYSTEM, "another question"))
    assert lease.worker_id == "w1"
    assert lease._predicted >= 160  # whole blocks of the system prompt, in the engine's tokens
    lease.release(usage=None, failed=False)
    status = worker_status(cluster.pool, cluster.worker(1)).kv_events
    assert status is not None and status.live and status.blocks_by_medium == {"GPU": len(tokens) // BLOCK}


async def test_the_tenant_salt_is_part_of_the_block_keys(cluster: Cluster) -> None:
    tokens = await cluster.tokens(SYSTEM, "q", salt="tenant-a")
    await cluster.publishers[0].store(tokens, salt="tenant-a")
    feed = cluster.worker(0).kv_events
    assert feed is not None
    await cluster.settle(lambda: feed.blocks > 0)
    assert feed.match(array("I", tokens), "tenant-a") == len(tokens) // BLOCK * BLOCK
    assert feed.match(array("I", tokens), "tenant-b") == 0
    assert feed.match(array("I", tokens), "") == 0


async def test_a_dropped_batch_is_replayed_and_removals_and_clears_apply(cluster: Cluster) -> None:
    publisher, feed = cluster.publishers[0], cluster.worker(0).kv_events
    assert feed is not None
    first = await cluster.tokens(SYSTEM, "one")
    second = await cluster.tokens(OTHER, "two")
    await publisher.store(first)
    hashes = await publisher.store(second, drop=True)  # lost on the way: only the replay has it
    await publisher.store(first, medium="CPU")  # the next batch reveals the gap
    await cluster.settle(lambda: feed.replayed == 1 and feed.blocks_by_medium().get("CPU"))
    assert feed.resets == 0
    assert feed.match(array("I", second), "") == len(second) // BLOCK * BLOCK
    await publisher.remove(hashes)
    await cluster.settle(lambda: feed.match(array("I", second), "") == 0)
    # GPU removal of the first prompt's blocks leaves the CPU copies: still a (slower) hit.
    await publisher.remove(publisher.block_hashes(first), medium="GPU")
    await cluster.settle(lambda: "GPU" not in feed.blocks_by_medium())
    assert feed.match(array("I", first), "") > 0
    await publisher.clear()
    await cluster.settle(lambda: feed.blocks == 0)


async def test_a_gap_the_engine_can_no_longer_replay_resets_the_index(cluster: Cluster) -> None:
    publisher, feed = cluster.publishers[0], cluster.worker(0).kv_events
    assert feed is not None
    await publisher.store(await cluster.tokens(SYSTEM, "one"))
    await cluster.settle(lambda: feed.blocks > 0)
    await publisher.store(await cluster.tokens(SYSTEM, "two"), drop=True)
    publisher.forget_buffer()
    await publisher.store(await cluster.tokens(FRESH, "three"))
    await cluster.settle(lambda: feed.resets == 1)
    assert feed.match(array("I", await cluster.tokens(SYSTEM, "one")), "") == 0


async def test_when_events_stop_the_approximate_tree_routes(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path, replay=False, encoding="array", stale_s=0.2)
    try:
        lease = await cluster.pool.acquire(chat_request(SYSTEM, "q"))
        home = lease.worker_id
        lease.release(usage=None, failed=False)
        feed = next(w for w in cluster.pool.workers() if w.id == home).kv_events
        assert feed is not None
        await asyncio.sleep(0.3)  # dispatched, and no event since: the engine's events stopped
        assert not feed.live()
        again = await cluster.pool.acquire(chat_request(SYSTEM, "q2"))
        assert again.worker_id == home  # the approximate tree still knows where the prompt went
        again.release(usage=None, failed=False)
    finally:
        await cluster.pool.aclose()
        for publisher in cluster.publishers:
            await publisher.close()


def test_both_encodings_decode_to_the_same_events() -> None:
    array_events = decode_batch(
        msgspec.msgpack.encode(
            [
                1.0,
                [
                    ["BlockStored", [11, 12], None, list(range(32)), 16, None, "GPU"],
                    ["BlockRemoved", [11], "GPU"],
                ],
            ]
        )
    )
    map_events = decode_batch(
        msgspec.msgpack.encode(
            {
                "ts": 1.0,
                "events": [
                    {
                        "type": "BlockStored",
                        "block_hashes": [b"\x01" * 32, b"\x02" * 32],
                        "parent_block_hash": None,
                        "token_ids": list(range(32)),
                        "block_size": 16,
                        "lora_id": None,
                        "medium": "GPU",
                        "lora_name": None,
                        "extra_keys": [["salt"], None],
                    },
                    {"type": "BlockRemoved", "block_hashes": [b"\x01" * 32], "medium": "GPU"},
                ],
                "data_parallel_rank": 0,
            }
        )
    )
    for events in (array_events, map_events):
        stored, removed = events
        assert isinstance(stored, BlocksStored) and isinstance(removed, BlocksRemoved)
        assert stored.block_size == 16 and len(stored.hashes) == 2 and stored.token_ids == tuple(range(32))
    assert isinstance(map_events[0], BlocksStored) and map_events[0].extra_keys == (("salt",), None)


async def test_an_engine_that_restarts_numbering_afresh_starts_the_index_over(cluster: Cluster) -> None:
    publisher, feed = cluster.publishers[0], cluster.worker(0).kv_events
    assert feed is not None
    await publisher.store(await cluster.tokens(SYSTEM, "one"))
    for _ in range(5):
        await publisher.store(await cluster.tokens(OTHER, "two"))
    stream = feed.streams[0]
    await cluster.settle(lambda: stream.last_seq is not None and stream.last_seq >= 5)
    await publisher.close()  # the engine restarts on the same sockets, its sequence from 0
    endpoint, replay = feed.spec.endpoint, feed.spec.replay_endpoint
    fresh = KvEventPublisher(endpoint, replay, block_size=BLOCK, encoding=publisher.encoding)
    fresh.start()
    cluster.publishers[0] = fresh
    tokens = await cluster.tokens(FRESH, "three")
    for _ in range(60):  # until the subscriber has reconnected (a few tries)
        await fresh.store(tokens)
        await asyncio.sleep(0.05)
        if feed.match(array("I", tokens), "") > 0:
            break
    assert feed.match(array("I", tokens), "") > 0, "the fresh numbering was never applied"
    assert feed.resets == 0 and feed.match(array("I", await cluster.tokens(SYSTEM, "one")), "") == 0
