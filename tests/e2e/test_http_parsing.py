"""The gateway reads requests exactly as stock uvicorn does: the same bytes, sent over raw sockets to
the real gateway and to a stock uvicorn serving a trivial app, get the same verdict.

A verdict is what a client can see: for each response on the connection, whether the parser refused
the request (uvicorn's 400 "Invalid HTTP request received.") or the app answered it, and whether the
connection was then closed. Both run httptools: the gateway through `radixgate serve`'s protocol
(uvicorn's own plus the head limits), the reference through stock uvicorn's.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from proxy.asgi_types import Message, Receive, Scope, Send
from tests.e2e.conftest import MODEL
from tests.gateway_server import GatewayServer

PARSER_REFUSAL = b"Invalid HTTP request received."
BODY = b'{"model": "%s", "prompt": "hi", "max_tokens": 1}' % MODEL.encode()
POST_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
GET = b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def post(*fields: bytes, body: bytes = BODY, length: bool = True) -> bytes:
    head = POST_HEAD + b"".join(field + b"\r\n" for field in fields)
    if length:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + b"\r\n" + body


CASES: dict[str, bytes] = {
    "plain": post(),
    **{f"header-name {name!r}": post(name + b": 1") for name in (b"X(y)", b"X@y", b'X"y', b"X/y")},
    "duplicate-content-length": post(b"Content-Length: %d" % len(BODY)),
    "conflicting-content-length": post(b"Content-Length: %d" % (len(BODY) + 1)),
    "content-length-and-chunked-smuggling": post(
        b"Content-Length: 4",
        b"Transfer-Encoding: chunked",
        body=b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY) + GET,
        length=False,
    ),
    "obs-fold": post(b"X-Folded: a", b" b"),
    "space-before-colon": post(b"X-Space : 1"),
    "pipelined": post() + GET + GET,
    "bare-lf": post().replace(b"\r\n", b"\n"),
}
"""Request bytes, each sent alone on a fresh connection."""

EXPECTED: dict[str, list[str]] = {
    "plain": ["app"],
    **{f"header-name {name!r}": ["refused"] for name in (b"X(y)", b"X@y", b'X"y', b"X/y")},
    "duplicate-content-length": ["refused"],
    "conflicting-content-length": ["refused"],
    "content-length-and-chunked-smuggling": ["refused"],  # nothing smuggled through: one refusal
    "obs-fold": ["refused"],
    "space-before-colon": ["refused"],
    "pipelined": ["app", "app", "app"],
    "bare-lf": ["refused"],
}
"""What RFC 9110/9112 allow and llhttp does: each case is refused or served as a whole, never in part."""


async def trivial_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, answers 200; handles the lifespan so uvicorn starts it as the gateway."""
    if scope["type"] == "lifespan":
        while True:
            message: Message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def stock_uvicorn() -> Iterator[GatewayServer]:
    server = GatewayServer(trivial_app, http="httptools").start()  # type: ignore[arg-type]  # any ASGI app
    yield server
    server.stop()


def exchange(port: int, data: bytes) -> tuple[list[str], bool]:
    """(verdict per response, connection closed by the server) for `data` sent on a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(1.0)
        received = b""
        closed = False
        try:
            while chunk := sock.recv(65536):
                received += chunk
            closed = True
        except TimeoutError:
            pass
    starts = [match.start() for match in re.finditer(rb"HTTP/1\.1 \d{3} ", received)]
    responses = [received[a:b] for a, b in zip(starts, [*starts[1:], len(received)], strict=True)]
    return ["refused" if PARSER_REFUSAL in r else "app" for r in responses], closed


@pytest.mark.parametrize("case", list(CASES))
def test_each_request_gets_the_verdict_stock_uvicorn_gives(
    case: str, gateway: GatewayServer, stock_uvicorn: GatewayServer
) -> None:
    ours = exchange(gateway.port, CASES[case])
    stock = exchange(stock_uvicorn.port, CASES[case])
    assert ours == stock
    assert ours[0], "every case is answered, never left hanging"
    assert ours[0] == EXPECTED[case]
    assert ours[1] == ("refused" in ours[0])  # a refusal closes the connection; served ones stay open
