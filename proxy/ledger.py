"""The usage ledger: requests and tokens per tenant, per model and per UTC day, in SQLite.

The database (stdlib `sqlite3`, WAL) lives at `auth.ledger_path`, or `usage.sqlite3` in `cache.dir`;
with neither, usage is kept in memory only and starts from zero with each process. The request path
never waits on it: `record` adds to in-memory totals (what budgets and `/v1/usage` read) and queues
the row for one writer thread, which upserts batches. Opening the ledger reads the totals back, so
usage and budgets survive a restart.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

logger = logging.getLogger("radixgate.ledger")

BudgetPeriod = Literal["day", "month", "total"]
FLUSH_INTERVAL_S = 0.5
"""Longest a recorded request waits in memory before its row is written."""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    tenant TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL,
    requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
    PRIMARY KEY (tenant, model, day)
)
"""
_UPSERT = """
INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant, model, day) DO UPDATE SET
    requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    cached_tokens = cached_tokens + excluded.cached_tokens
"""


@dataclass(slots=True)
class UsageTotals:
    """What one tenant used in one period."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, requests: int, prompt: int, completion: int, cached: int) -> None:
        self.requests += requests
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cached_tokens += cached


def period_key(period: BudgetPeriod, now: float) -> str:
    """The UTC day (`2026-12-01`), month (`2026-12`) or `total` that `now` falls in."""
    if period == "total":
        return "total"
    day = time.strftime("%Y-%m-%d", time.gmtime(now))
    return day if period == "day" else day[:7]


class UsageLedger:
    """In-memory totals per (tenant, period) over a SQLite table written behind."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._clock = clock
        self._totals: dict[tuple[str, str], UsageTotals] = defaultdict(UsageTotals)
        self._rows: queue.SimpleQueue[tuple[str, str, str, int, int, int, int] | None] = queue.SimpleQueue()
        self._db = sqlite3.connect(":memory:" if path is None else str(path), check_same_thread=False)
        if path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._load()
        self._writer = threading.Thread(target=self._write_behind, name="radixgate-ledger", daemon=True)
        self._writer.start()

    def _load(self) -> None:
        rows = self._db.execute(
            "SELECT tenant, day, SUM(requests), SUM(prompt_tokens), SUM(completion_tokens), "
            "SUM(cached_tokens) FROM usage GROUP BY tenant, day"
        )
        for tenant, day, requests, prompt, completion, cached in rows:
            for key in (day, day[:7], "total"):
                self._totals[(tenant, key)].add(requests, prompt, completion, cached)

    def record(self, tenant: str, model: str, prompt: int, completion: int, cached: int) -> None:
        """One served request and its tokens (zeros for a response-cache hit)."""
        now = self._clock()
        day = period_key("day", now)
        for key in (day, day[:7], "total"):
            self._totals[(tenant, key)].add(1, prompt, completion, cached)
        self._rows.put((tenant, model, day, 1, prompt, completion, cached))

    def totals(self, tenant: str, period: BudgetPeriod) -> UsageTotals:
        """What `tenant` used in the current `period`."""
        return self._totals.get((tenant, period_key(period, self._clock())), UsageTotals())

    def tenants(self) -> list[str]:
        """Every tenant with recorded usage."""
        return sorted({tenant for tenant, key in self._totals if key == "total"})

    def close(self) -> None:
        """Write what is queued and close the database."""
        self._rows.put(None)
        self._writer.join(10)
        self._db.close()

    def _write_behind(self) -> None:
        done = False
        while not done:
            batch = []
            try:
                row = self._rows.get(timeout=FLUSH_INTERVAL_S)
            except queue.Empty:
                continue
            while row is not None:
                batch.append(row)
                try:
                    row = self._rows.get_nowait()
                except queue.Empty:
                    break
            done = row is None
            if batch:
                try:
                    with self._db:
                        self._db.executemany(_UPSERT, batch)
                except sqlite3.Error:  # the ledger must never fail a request: log and go on
                    logger.exception("usage ledger write failed; %d rows lost", len(batch))
