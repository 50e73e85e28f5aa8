"""A data-parallel engine's KV events: one stream per rank, discovered, indexed as one worker."""

from __future__ import annotations

import asyncio
import socket
from array import array
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from adapters.kv_events_info import KvEventsAdvert, sglang_advert, vllm_ranks
from benchmarks.routing.kv_publisher import KvEventPublisher
from benchmarks.routing.workload import word, write_word_tokenizer
from proxy.routing.admin import worker_status
from proxy.routing.config import KvEventsSpec, RoutingSettings, WorkerSpec
from proxy.routing.kv_discovery import resolve
from proxy.routing.kv_events import KvEventFeed
from proxy.routing.kv_stream import rank_endpoint
from proxy.routing.pool import WorkerPool
from tests.proxy.routing.conftest import FakeEngine, chat_request

BLOCK = 16
RANKS = 2
SYSTEM = " ".join(word(i % 50) for i in range(160))
OTHER = " ".join(word(100 + i) for i in range(40))


def _free_ports(count: int) -> int:
    """A port P with P .. P + count - 1 all free on loopback (the ranks' consecutive ports)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65_535:
            continue
        try:
            held = []
            for port in range(base, base + count):
                taken = socket.socket()
                held.append(taken)
                taken.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for taken in held:
                taken.close()
        return base
    raise RuntimeError("no run of free ports")


class DataParallelEngine(FakeEngine):
    """An engine whose server info reports `advert` (KV events on wildcard binds, its ranks)."""

    def __init__(self, spec: WorkerSpec, advert: KvEventsAdvert | None) -> None:
        super().__init__(spec)
        self.advert = advert

    async def kv_events_advert(self) -> KvEventsAdvert | None:
        return self.advert


class Cluster:
    def __init__(self, pool: WorkerPool, publishers: list[KvEventPublisher]) -> None:
        self.pool = pool
        self.publishers = publishers

    @property
    def feed(self) -> KvEventFeed:
        feed = self.pool.workers()[0].kv_events
        assert feed is not None
        return feed

    async def tokens(self, system: str, user: str) -> list[int]:
        ids, kind = await self.pool.prompts.tokens(chat_request(system, user), [])
        assert kind == "tokenizer.json"
        return list(ids)

    async def settle(self, predicate: object, timeout_s: float = 3.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not predicate():  # type: ignore[operator]
            assert asyncio.get_running_loop().time() < deadline, "events not applied in time"
            await asyncio.sleep(0.01)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    pub, replay = _free_ports(RANKS), _free_ports(RANKS)
    publishers = []
    for rank in range(RANKS):  # each rank binds the configured ports plus its rank, as vLLM's do
        publisher = KvEventPublisher(
            rank_endpoint(f"tcp://127.0.0.1:{pub}", rank),
            rank_endpoint(f"tcp://127.0.0.1:{replay}", rank),
            block_size=BLOCK,
            rank=rank,
        )
        publisher.start()
        publishers.append(publisher)
    advert = KvEventsAdvert(f"tcp://*:{pub}", f"tcp://*:{replay}", ranks=(0, 1))
    specs = [  # w0: the data-parallel engine, events discovered; w1: no events
        WorkerSpec(url="http://127.0.0.1:9300", id="w0", models=["m"]),
        WorkerSpec(url="http://127.0.0.1:9301", id="w1", models=["m"]),
    ]
    tokenizer = write_word_tokenizer(tmp_path / "tokenizer.json")
    settings = msgspec.convert({"tokenizers": {"m": str(tokenizer)}}, RoutingSettings)
    pool = WorkerPool(
        ["m"],
        specs,
        settings,
        engine_factory=lambda spec: DataParallelEngine(spec, advert if spec.id == "w0" else None),
    )
    await pool.start()
    built = Cluster(pool, publishers)
    await built.settle(lambda: pool.workers()[0].kv_events is not None)
    for publisher, stream in zip(publishers, built.feed.streams, strict=True):
        while stream.last_seq is None:  # ZMQ's slow joiner: publish until each rank's stream sees one
            await publisher.clear()
            await asyncio.sleep(0.02)
    yield built
    await pool.aclose()
    for publisher in publishers:
        await publisher.close()


async def test_every_ranks_stream_is_followed_as_the_one_worker(cluster: Cluster) -> None:
    feed = cluster.feed
    assert [s.endpoint for s in feed.streams] == [
        feed.spec.endpoint,
        rank_endpoint(feed.spec.endpoint, 1),
    ]
    tokens = await cluster.tokens(SYSTEM, "first question")
    await cluster.publishers[1].store(tokens)  # rank 1 computed it
    await cluster.settle(lambda: feed.match(array("I", tokens)) > 0)
    assert feed.streams[0].index.blocks == 0
    lease = await cluster.pool.acquire(chat_request(SYSTEM, "another question"))
    assert lease.worker_id == "w0" and lease._predicted >= 160  # rank 1's blocks count for w0
    lease.release(usage=None, failed=False)
    status = worker_status(cluster.pool, cluster.pool.workers()[0]).kv_events
    assert status is not None and status.live and [r.rank for r in status.ranks] == [0, 1]
    assert status.blocks == status.ranks[1].blocks == len(tokens) // BLOCK
    assert "data-parallel ranks [0, 1]" in status.source


async def test_a_dropped_batch_on_one_rank_is_replayed_from_that_ranks_socket(cluster: Cluster) -> None:
    feed, (rank0, rank1) = cluster.feed, cluster.publishers
    first, second = await cluster.tokens(SYSTEM, "one"), await cluster.tokens(OTHER, "two")
    await rank0.store(first)
    hashes = await rank1.store(second, drop=True)  # lost on the way: only rank 1's replay has it
    await rank1.store(first, medium="CPU")  # rank 1's next batch reveals its gap
    await cluster.settle(lambda: feed.streams[1].replayed == 1)
    # Each rank numbers its own batches: rank 0's stream saw no gap and nothing restarted.
    assert (feed.streams[0].replayed, feed.resets) == (0, 0)
    assert feed.match(array("I", second)) == len(second) // BLOCK * BLOCK
    assert feed.streams[0].index.match(array("I", second)) == 0
    await rank1.remove(hashes)
    await cluster.settle(lambda: feed.match(array("I", second)) == 0)
    # A gap rank 1 can no longer replay resets rank 1's blocks only.
    await rank1.store(second, drop=True)
    rank1.forget_buffer()
    await rank1.store(await cluster.tokens(OTHER, "three"))
    await cluster.settle(lambda: feed.streams[1].resets == 1)
    assert feed.streams[1].index.match(array("I", first)) == 0
    assert feed.match(array("I", first)) == len(first) // BLOCK * BLOCK  # rank 0 still holds it


def test_the_ranks_behind_an_api_server_come_from_the_engines_parallel_config() -> None:
    assert vllm_ranks({"data_parallel_size": 4, "data_parallel_size_local": 4}) == (0, 1, 2, 3)
    # Two nodes of two ranks: the head's API server sees its own node's publishers only.
    assert vllm_ranks({"data_parallel_size": 4, "data_parallel_size_local": 2}) == (0, 1)
    # One API server per rank (external load balancing), or per node (hybrid).
    external = {"data_parallel_size": 4, "data_parallel_rank": 3, "data_parallel_external_lb": True}
    assert vllm_ranks(external) == (3,)
    hybrid = {
        "data_parallel_size": 4,
        "data_parallel_size_local": 2,
        "data_parallel_rank": 2,
        "data_parallel_hybrid_lb": True,
    }
    assert vllm_ranks(hybrid) == (2, 3)
    assert vllm_ranks({}) == (0,)
    huge = vllm_ranks({"data_parallel_size": 10**12})  # not believed past a bound, then refused
    assert len(huge) == 4_096
    assert resolve(KvEventsAdvert("tcp://*:5557", ranks=huge), "http://10.0.0.5:8000").spec is None
    config = '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'
    advert = sglang_advert({"kv_events_config": config, "dp_size": 2, "enable_dp_attention": True})
    assert advert is not None and advert.ranks == (0, 1)


def test_discovered_ranks_resolve_to_consecutive_ports_on_the_workers_host() -> None:
    found = resolve(KvEventsAdvert("tcp://*:5557", "tcp://*:5567", ranks=(2, 3)), "http://10.0.0.5:8000")
    assert found.spec is not None and found.spec.data_parallel_ranks == {2, 3}
    feed = KvEventFeed(found.spec, clock=lambda: 0.0)
    assert [(s.endpoint, s.replay_endpoint) for s in feed.streams] == [
        ("tcp://10.0.0.5:5559", "tcp://10.0.0.5:5569"),
        ("tcp://10.0.0.5:5560", "tcp://10.0.0.5:5570"),
    ]
    too_far = resolve(KvEventsAdvert("tcp://*:65535", ranks=(0, 1)), "http://10.0.0.5:8000")
    assert too_far.spec is None and "past port 65535" in too_far.note


@pytest.mark.parametrize(("ranks", "why"), [([], "length"), ([-1], ">= 0")])
def test_configured_ranks_are_checked(ranks: list[int], why: str) -> None:
    events = {"endpoint": "tcp://10.0.0.5:5557", "data_parallel_ranks": ranks}
    with pytest.raises(msgspec.ValidationError, match=why):
        msgspec.convert(events, KvEventsSpec)
    spec = msgspec.convert({**events, "data_parallel_ranks": [1, 0, 1]}, KvEventsSpec)
    assert [s.rank for s in KvEventFeed(spec, clock=lambda: 0.0).streams] == [0, 1]
