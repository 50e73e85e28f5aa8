"""A client that goes away cancels the upstream call at once: the upstream sees its connection
closed within a second, before the first byte as well as mid-stream."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.conftest import MODEL
from tests.gateway_server import GatewayServer
from tests.upstream_server import Fault, UpstreamServer

MESSAGES = [{"role": "user", "content": "Say hello"}]
CANCEL_WITHIN_S = 1.0


def _assert_upstream_cancelled(upstream: UpstreamServer, gave_up_at: float) -> None:
    received = upstream.generation_requests()[0]
    assert received.disconnected.wait(CANCEL_WITHIN_S + 1), "the upstream never saw its connection closed"
    assert received.disconnected_at is not None
    assert received.disconnected_at - gave_up_at < CANCEL_WITHIN_S


def _wait_idle(gateway: GatewayServer) -> int:
    deadline = time.monotonic() + 2
    while True:
        active = int(httpx.get(f"{gateway.base_url}/health").json()["details"]["active_requests"])
        if active == 0 or time.monotonic() > deadline:
            return active
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_before_the_first_byte_cancels_the_upstream(
    gateway: GatewayServer, upstream: UpstreamServer, stream: bool
) -> None:
    upstream.faults.append(Fault(delay_s=1.8))  # still answering when the client has long gone
    body = {"model": MODEL, "messages": MESSAGES, "stream": stream}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}/chat/completions", json=body, timeout=httpx.Timeout(5, read=0.3))
    gave_up_at = time.monotonic()
    _assert_upstream_cancelled(upstream, gave_up_at)
    assert _wait_idle(gateway) == 0


def test_disconnect_mid_stream_cancels_the_upstream(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(chunk_delay_s=0.25))
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/chat/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: {")
        assert next(lines) == ""
    gave_up_at = time.monotonic()
    _assert_upstream_cancelled(upstream, gave_up_at)
    assert _wait_idle(gateway) == 0


def test_gateway_keeps_serving_after_disconnects(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(delay_s=1.0))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gateway.url}/completions",
            json={"model": MODEL, "prompt": "x"},
            timeout=httpx.Timeout(5, read=0.2),
        )
    answer = httpx.post(f"{gateway.url}/completions", json={"model": MODEL, "prompt": "x"}).json()
    assert answer["choices"][0]["text"] == "Hello from the test upstream."
