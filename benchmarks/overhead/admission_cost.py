"""CPU cost of tenant admission per request, in process: the limiter's admit and settle plus the usage
ledger's record (SQLite written behind by its own thread), against none of it.

    python -m benchmarks.overhead.admission_cost --requests 50000

Prints microseconds of CPU per request (process time, so the ledger's writer thread is counted) for:
`unlimited` (a tenant with no limits, ledger in memory), `limited` (requests, tokens, concurrency and
a budget, ledger in memory) and `limited_sqlite` (the same, ledger in a SQLite file).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from adapters.schema import CompletionRequest
from proxy.ledger import UsageLedger
from proxy.tenancy import TenantLimiter, TenantLimits

BIG = 10**12
LIMITS = TenantLimits(
    requests_per_minute=BIG, tokens_per_minute=BIG, max_concurrent_requests=BIG, token_budget=BIG
)


def measure(limiter: TenantLimiter, ledger: UsageLedger, tenant: str, requests: int) -> float:
    params = CompletionRequest(model="m", prompt="x", max_tokens=64)
    started = time.process_time()
    for _ in range(requests):
        admission = limiter.admit(tenant, params, 400)
        admission.settle(160)
        ledger.record(tenant, "m", 100, 60, 32)
    ledger.close()  # the writer's rows land, inside the measured time
    return (time.process_time() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50_000)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        for name, path, limited in (
            ("unlimited", None, False),
            ("limited", None, True),
            ("limited_sqlite", Path(directory) / "usage.sqlite3", True),
        ):
            ledger = UsageLedger(path)
            limiter = TenantLimiter({"acme": LIMITS} if limited else {}, ledger)
            results[name] = round(measure(limiter, ledger, "acme", args.requests), 2)
    print(json.dumps({"cpu_us_per_request": results}))


if __name__ == "__main__":
    main()
