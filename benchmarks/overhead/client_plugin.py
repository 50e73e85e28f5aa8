"""pytest plugin: run a test session with every httpx.AsyncClient on an experimental transport.

    RADIXGATE_BENCH_CLIENT=asyncio-backend python -m pytest -p benchmarks.overhead.client_plugin tests/e2e
    RADIXGATE_BENCH_CLIENT=raw-transport python -m pytest -p benchmarks.overhead.client_plugin tests/e2e

Evidence that a transport keeps the adapters' behaviour (timeouts, disconnects, streaming errors)
before anyone adopts it; it changes nothing unless loaded with `-p`.
"""

from __future__ import annotations

import os

from benchmarks.overhead.serve import use_client

use_client(os.environ.get("RADIXGATE_BENCH_CLIENT", "asyncio-backend"))
