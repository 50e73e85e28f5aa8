"""The request head's time and size limits on the real server: a slow or silent client is answered 408
and let go, an oversized head 431, and neither holds the server from anyone else."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from proxy.app import create_app
from proxy.settings import ServerSettings
from tests.e2e.conftest import gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

TIMEOUT_S = 0.6
MAX_HEAD = 4096


@pytest.fixture(scope="module")
def guarded(upstream_server: UpstreamServer) -> Iterator[GatewayServer]:
    server = ServerSettings(header_timeout_s=TIMEOUT_S, max_header_bytes=MAX_HEAD)
    gateway = GatewayServer(create_app(gateway_settings(upstream_server.url, server=server))).start()
    yield gateway
    gateway.stop()


def answer(sock: socket.socket) -> tuple[int, dict[str, object], bool]:
    """(status, JSON error, closed) of the one answer on `sock`."""
    sock.settimeout(5)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)["error"], True


def test_a_silent_connection_gets_408_and_is_closed(guarded: GatewayServer) -> None:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        status, error, closed = answer(sock)
    assert (status, error["code"], closed) == (408, "request_timeout", True)
    assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 2


def test_a_head_sent_a_byte_at_a_time_gets_408(guarded: GatewayServer) -> None:
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        for byte in b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ":
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.05)
        status, error, _ = answer(sock)
    assert (status, error["code"]) == (408, "request_timeout")


def test_an_oversized_head_gets_431_and_a_normal_one_passes(guarded: GatewayServer) -> None:
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        try:
            sock.sendall(b"GET /health/live HTTP/1.1\r\n")
            for number in range(10):
                sock.sendall(b"X-Big-%d: " % number + b"a" * 1000 + b"\r\n")
        except OSError:
            pass
        status, error, _ = answer(sock)
    assert (status, error["code"]) == (431, "request_header_fields_too_large")
    headers = {f"x-h{n}": "v" * 100 for n in range(20)}  # ~2.5 KB, under the limit
    assert httpx.get(guarded.base_url + "/health/live", headers=headers, timeout=5).status_code == 200


def test_a_kept_alive_connection_is_not_cut_between_requests(guarded: GatewayServer) -> None:
    with httpx.Client(base_url=guarded.base_url, timeout=5) as client:
        for _ in range(3):
            assert client.get("/health/live").status_code == 200
            time.sleep(TIMEOUT_S * 1.5)  # idle longer than the head limit: keep-alive's, not 408
