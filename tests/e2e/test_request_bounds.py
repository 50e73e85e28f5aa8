"""Bounds on one request, through the real gateway: what is out of bounds is a 400 naming the field
before anything reaches an engine, and a request with no token limit gets the configured cap."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from proxy.app import create_app
from proxy.settings import DEFAULT_MAX_TOKENS_CAP, LimitsSettings
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

JSON = {"content-type": "application/json"}
CHAT = b'{"model": "%s", "messages": %s%s}'


def chat(messages: bytes = b'[{"role": "user", "content": "hi"}]', extra: bytes = b"") -> bytes:
    return CHAT % (MODEL.encode(), messages, extra)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(extra=b', "n": 1000000000'), "n"),
        (chat(extra=b', "n": 0'), "n"),
        (chat(extra=b', "max_tokens": -5'), "max_tokens"),
        (chat(extra=b', "max_completion_tokens": 0'), "max_completion_tokens"),
        (chat(extra=b', "top_logprobs": 500'), "top_logprobs"),
        (chat(b'[{"role": "wizard", "content": "hi"}]'), "messages[0].role"),
        (chat(b"[]"), "messages"),
        (
            chat(b'[{"role": "user", "content": "x"}' + b', {"role": "user", "content": "x"}' * 4096 + b"]"),
            "messages",
        ),
        (chat(extra=b', "x": ' + b"[" * 5000 + b"]" * 5000), None),  # nested too deeply
    ],
    ids=[
        "n-huge",
        "n-zero",
        "max-tokens",
        "max-completion-tokens",
        "top-logprobs",
        "role",
        "no-messages",
        "too-many-messages",
        "deep-json",
    ],
)
def test_out_of_bounds_is_a_400_naming_the_field(
    body: bytes, param: str | None, gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    response = httpx.post(gateway.url + "/chat/completions", content=body, headers=JSON, timeout=10)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert not upstream.generation_requests()  # refused before any engine saw it


def test_a_request_without_a_limit_gets_the_default_cap(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    assert (
        httpx.post(gateway.url + "/chat/completions", content=chat(), headers=JSON, timeout=10).status_code
        == 200
    )
    assert upstream.generation_requests()[-1].json["max_tokens"] == DEFAULT_MAX_TOKENS_CAP
    limited = chat(extra=b', "max_tokens": 7')
    assert (
        httpx.post(gateway.url + "/chat/completions", content=limited, headers=JSON, timeout=10).status_code
        == 200
    )
    assert upstream.generation_requests()[-1].json["max_tokens"] == 7


@pytest.fixture(scope="module")
def bounded_gateway(upstream_server: UpstreamServer) -> Iterator[GatewayServer]:
    limits = LimitsSettings(default_max_tokens=0, max_tokens=64)
    server = GatewayServer(create_app(gateway_settings(upstream_server.url, limits=limits))).start()
    yield server
    server.stop()


def test_the_configured_bound_and_no_default(
    bounded_gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    over = httpx.post(
        bounded_gateway.url + "/chat/completions",
        content=chat(extra=b', "max_tokens": 65'),
        headers=JSON,
        timeout=10,
    )
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
    assert (
        httpx.post(bounded_gateway.url + "/chat/completions", content=chat(), headers=JSON).status_code == 200
    )
    assert "max_tokens" not in upstream.generation_requests()[-1].json  # no default cap configured


def test_two_authorization_headers_are_a_400(gateway: GatewayServer) -> None:
    headers = [
        ("authorization", "Bearer a"),
        ("authorization", "Bearer b"),
        ("content-type", "application/json"),
    ]
    for path in ("/chat/completions", "/cache/stats"):
        method = "POST" if path == "/chat/completions" else "GET"
        response = httpx.request(method, gateway.url + path, content=chat(), headers=headers, timeout=10)
        assert response.status_code == 400, (path, response.text)
        assert response.json()["error"]["code"] == "invalid_header"


def test_an_upgrade_request_is_answered_at_once(gateway: GatewayServer) -> None:
    body = chat()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=3) as sock:
        sock.sendall(request)
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 4")
