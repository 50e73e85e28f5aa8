"""`alerts` in `GET /v1/cache/stats` over real worker processes: a killed worker raises the same
alert Prometheus would (name, severity), with a `since` that holds across reads and clears when
the worker is back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.routing_support import MODEL, SimWorker, start_gateway, start_workers, stop_all, wait_for
from tests.gateway_server import GatewayServer


@pytest.fixture
def stack() -> Iterator[tuple[GatewayServer, list[SimWorker]]]:
    workers = start_workers(2)
    gateway = start_gateway(workers, health_success_threshold=1)
    yield gateway, workers
    gateway.stop()
    stop_all(workers)


def alerts(gateway: GatewayServer) -> dict[tuple[str, str], dict[str, Any]]:
    body = httpx.get(f"{gateway.url}/cache/stats", timeout=5).json()
    return {(a["name"], a["source"]): a for a in body["alerts"]}


def test_worker_alerts_rise_hold_their_since_and_clear(stack: tuple[GatewayServer, list[SimWorker]]) -> None:
    gateway, workers = stack
    wait_for(lambda: alerts(gateway) == {})  # healthy (once the first health checks are in)
    before = time.time()
    workers[0].kill()
    wait_for(lambda: ("RadixgateWorkerDown", "w0") in alerts(gateway))
    first = alerts(gateway)
    down = first[("RadixgateWorkerDown", "w0")]
    assert down["severity"] == "warning" and before <= down["since"] <= time.time()
    assert ("RadixgateNoHealthyWorker", MODEL) not in first  # w1 still serves it
    time.sleep(0.3)
    assert alerts(gateway)[("RadixgateWorkerDown", "w0")]["since"] == down["since"]

    workers[1].kill()
    wait_for(lambda: ("RadixgateNoHealthyWorker", MODEL) in alerts(gateway))
    assert alerts(gateway)[("RadixgateNoHealthyWorker", MODEL)]["severity"] == "critical"

    workers[0].start()
    wait_for(lambda: ("RadixgateWorkerDown", "w0") not in alerts(gateway))
    assert ("RadixgateNoHealthyWorker", MODEL) not in alerts(gateway)
