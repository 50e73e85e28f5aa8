"""Stored responses (`store: true`): the response object, its conversation and its worker, per tenant.

One SQLite table (stdlib `sqlite3`, WAL like the usage ledger) in `responses.path`, else
`responses.sqlite3` beside the ledger in `cache.dir`, else in memory. A row holds what
`GET /v1/responses/{id}` answers, the chat messages of the whole conversation up to and including
this response's output (what a follow-up with `previous_response_id` continues from), its input
items (`GET /v1/responses/{id}/input_items`), and the worker that served it (the routing hint of that
follow-up). Rows live `responses.ttl_s` seconds; an expired row reads as absent and is deleted by a
later write. Every read and delete is keyed by (tenant, id), so another tenant's id is unknown.

Calls block on SQLite: `run` makes them in a worker thread when the database is a file, inline when it
is in memory (nothing to wait for there, and a thread hop costs more than the query).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    tenant TEXT NOT NULL, id TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL,
    response BLOB NOT NULL, conversation BLOB NOT NULL, worker TEXT, native INTEGER NOT NULL,
    input_items BLOB NOT NULL DEFAULT X'5B5D', PRIMARY KEY (tenant, id)
)
"""
_ADD_INPUT_ITEMS = "ALTER TABLE responses ADD COLUMN input_items BLOB NOT NULL DEFAULT X'5B5D'"
"""A database written before input items were kept gets the column; its rows list none (`[]`)."""
_EXPIRY_INDEX = "CREATE INDEX IF NOT EXISTS responses_expiry ON responses (expires_at)"
PURGE_EVERY_WRITES = 64
"""Expired rows are deleted on every this many writes (reads skip them anyway)."""


@dataclass(slots=True, frozen=True)
class StoredTurn:
    """One stored response."""

    response: bytes
    """The response object's JSON, as `GET /v1/responses/{id}` answers it."""
    conversation: bytes
    """JSON list of the chat messages from the first turn through this response's output."""
    worker: str | None
    """The worker that served it; a follow-up is routed there while its load allows."""
    native: bool = False
    """The worker served `/v1/responses` itself and keeps the conversation: a follow-up goes there only
    (and `conversation` is empty)."""
    input_items: bytes = b"[]"
    """JSON list of the response's input items (`proxy.responses.items`), oldest first."""


class ResponseStore:
    """Responses by (tenant, id) in SQLite, each with a time to live."""

    def __init__(self, path: Path | None, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._in_memory = path is None
        self._db = sqlite3.connect(":memory:" if path is None else str(path), check_same_thread=False)
        if path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(responses)")}
        if "input_items" not in columns:
            self._db.execute(_ADD_INPUT_ITEMS)
        self._db.execute(_EXPIRY_INDEX)
        self._db.commit()
        self._writes = 0

    async def run(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`call(*args)` (one of this store's methods) from the event loop (see the module docstring)."""
        if self._in_memory:
            return call(*args, **kwargs)
        return await asyncio.to_thread(call, *args, **kwargs)

    def put(self, tenant: str, response_id: str, turn: StoredTurn) -> None:
        """Store (or replace) one response for `tenant`."""
        now = self._clock()
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    tenant,
                    response_id,
                    now,
                    now + self.ttl_s,
                    turn.response,
                    turn.conversation,
                    turn.worker,
                    turn.native,
                    turn.input_items,
                ),
            )
            self._writes += 1
            if self._writes % PURGE_EVERY_WRITES == 0:
                self._db.execute("DELETE FROM responses WHERE expires_at <= ?", (now,))
            self._db.commit()

    def get(self, tenant: str, response_id: str) -> StoredTurn | None:
        """The live response `response_id` of `tenant`, or None (unknown, expired or another tenant's)."""
        with self._lock:
            row = self._db.execute(
                "SELECT response, conversation, worker, native, input_items FROM responses"
                " WHERE tenant = ? AND id = ? AND expires_at > ?",
                (tenant, response_id, self._clock()),
            ).fetchone()
        if row is None:
            return None
        return StoredTurn(bytes(row[0]), bytes(row[1]), row[2], bool(row[3]), bytes(row[4]))

    def delete(self, tenant: str, response_id: str) -> bool:
        """Delete one response of `tenant`; False when it had none live under that id."""
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM responses WHERE tenant = ? AND id = ? AND expires_at > ?",
                (tenant, response_id, self._clock()),
            )
            self._db.commit()
        return cursor.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._db.close()
