"""`ResponseStore`: per-tenant rows with a time to live, in a SQLite file that outlives the process."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from proxy.responses.store import ResponseStore, StoredTurn

TURN = StoredTurn(b'{"id": "resp_1"}', b'[{"role": "user", "content": "hi"}]', "w1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_row_is_its_tenants_only(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "responses.sqlite3", ttl_s=60)
    store.put("alice", "resp_1", TURN)
    assert store.get("alice", "resp_1") == TURN
    assert store.get("bob", "resp_1") is None
    assert not store.delete("bob", "resp_1")
    assert store.delete("alice", "resp_1")
    assert store.get("alice", "resp_1") is None
    store.close()


def test_rows_expire_after_their_ttl() -> None:
    clock = Clock()
    store = ResponseStore(None, ttl_s=60, clock=clock)
    store.put("alice", "resp_1", TURN)
    clock.now += 59
    assert store.get("alice", "resp_1") is not None
    clock.now += 2
    assert store.get("alice", "resp_1") is None
    assert not store.delete("alice", "resp_1")


def test_rows_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    store = ResponseStore(path, ttl_s=60)
    store.put("alice", "resp_1", TURN)
    store.close()
    reopened = ResponseStore(path, ttl_s=60)
    assert reopened.get("alice", "resp_1") == TURN
    reopened.close()


async def test_run_serves_the_loop_from_memory_or_a_file(tmp_path: Path) -> None:
    for store in (ResponseStore(None, ttl_s=60), ResponseStore(tmp_path / "r.sqlite3", ttl_s=60)):
        await store.run(store.put, "alice", "resp_1", TURN)
        assert await store.run(store.get, "alice", "resp_1") == TURN
        store.close()


def test_a_database_from_before_input_items_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE responses (tenant TEXT NOT NULL, id TEXT NOT NULL, created_at REAL NOT NULL,"
        " expires_at REAL NOT NULL, response BLOB NOT NULL, conversation BLOB NOT NULL, worker TEXT,"
        " native INTEGER NOT NULL, PRIMARY KEY (tenant, id))"
    )
    old.execute("INSERT INTO responses VALUES ('alice', 'resp_0', 0, 9e18, X'7B7D', X'5B5D', 'w1', 0)")
    old.commit()
    old.close()
    store = ResponseStore(path, ttl_s=60)
    assert store.get("alice", "resp_0") == StoredTurn(b"{}", b"[]", "w1", input_items=b"[]")
    listed = StoredTurn(b"{}", b"[]", "w1", input_items=b'[{"id": "msg_1"}]')
    store.put("alice", "resp_1", listed)
    assert store.get("alice", "resp_1") == listed
    store.close()
