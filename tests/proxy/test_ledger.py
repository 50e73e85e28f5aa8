"""The usage ledger: totals per period, written behind to SQLite, read back by the next process."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from proxy.ledger import UsageLedger, period_key

DEC_1 = 1_796_083_200.0  # 2026-12-01 00:00 UTC


def test_periods_are_utc_days_months_and_total() -> None:
    assert (period_key("day", DEC_1), period_key("month", DEC_1), period_key("total", DEC_1)) == (
        "2026-12-01",
        "2026-12",
        "total",
    )


def test_usage_survives_a_restart_and_each_period_counts_its_own(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    now = [DEC_1]
    ledger = UsageLedger(path, clock=lambda: now[0])
    ledger.record("acme", "m", prompt=100, completion=20, cached=64)
    now[0] += 86_400  # the next day, same month
    ledger.record("acme", "m", prompt=10, completion=5, cached=0)
    ledger.record("globex", "m", prompt=1, completion=1, cached=0)
    ledger.close()
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone() == ("wal",)

    reopened = UsageLedger(path, clock=lambda: now[0])
    day, month = reopened.totals("acme", "day"), reopened.totals("acme", "month")
    assert (day.requests, day.total_tokens) == (1, 15)
    assert (month.requests, month.prompt_tokens, month.completion_tokens, month.cached_tokens) == (
        2,
        110,
        25,
        64,
    )
    assert reopened.totals("acme", "total").total_tokens == 135
    assert reopened.tenants() == ["acme", "globex"]
    now[0] += 31 * 86_400  # January: a new month, the same total
    assert reopened.totals("acme", "month").requests == 0 and reopened.totals("acme", "total").requests == 2
    reopened.close()
