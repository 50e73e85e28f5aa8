"""`GatewayHttpProtocol` serves plain generation requests in a `DirectCycle`, and every unusual
request through uvicorn's cycle, with the same answers on the wire (real sockets on loopback)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

import proxy.server_protocol
from proxy.app import create_app
from proxy.direct_cycle import DirectCycle
from proxy.settings import ServerSettings, Settings
from tests.gateway_server import GatewayServer
from tests.proxy.scripted_engine import BODY, CHUNKS, ScriptedEngine, scripted_pool

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
STREAM = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
MAX_BODY = 4096


class Response:
    def __init__(self, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


@pytest.fixture
def direct_cycles(monkeypatch: pytest.MonkeyPatch) -> list[DirectCycle]:
    """Every `DirectCycle` the protocol starts."""
    started: list[DirectCycle] = []

    class Counted(DirectCycle):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(proxy.server_protocol, "DirectCycle", Counted)
    return started


@pytest.fixture
def gateway() -> Iterator[GatewayServer]:
    settings = Settings(server=ServerSettings(max_body_bytes=MAX_BODY))
    server = GatewayServer(create_app(settings, router=scripted_pool([ScriptedEngine()]))).start()
    yield server
    server.stop()


def post(path: str, body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "host: gateway", "content-type: application/json", *extra]
    if not any(line.lower().startswith("transfer-encoding") for line in extra):
        head.append(f"content-length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> Response:
    """One HTTP/1.1 response: its body by Content-Length, chunks, or up to the connection's end (none
    for an informational one)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head[:-4].split(b"\r\n")
    headers = dict(line.split(b": ", 1) for line in lines)
    status = int(status_line.split()[1])
    if status < 200:  # 100 Continue: no body, the answer follows
        body = b""
    elif b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding") == b"chunked":
        parts = []
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            parts.append((await reader.readexactly(size + 2))[:-2])
        await reader.readexactly(2)
        body = b"".join(parts)
    else:
        body = await reader.read()
    return Response(status, headers, body)


async def exchange(server: GatewayServer, data: bytes, answers: int = 1) -> list[Response]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(data)
        return [await asyncio.wait_for(read_response(reader), 5) for _ in range(answers)]
    finally:
        writer.close()


def sse_payloads(body: bytes) -> list[bytes]:
    return [event.removeprefix(b"data: ") for event in body.split(b"\n\n") if event]


async def test_json_and_streamed_answers_are_served_directly_on_one_connection(
    gateway: GatewayServer, direct_cycles: list[DirectCycle]
) -> None:
    completion = json.dumps({"model": "m", "prompt": "hi"}).encode()
    requests = [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", STREAM),
        ("/v1/completions", completion),
    ]
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        answers = []
        for path, body in requests:  # one after the other on the kept-alive connection
            writer.write(post(path, body))
            answers.append(await asyncio.wait_for(read_response(reader), 5))
    finally:
        writer.close()
    first, streamed, second = answers
    for answer in (first, second):
        assert (answer.status, answer.body) == (200, BODY)
        assert answer.headers[b"content-type"] == b"application/json"
        assert b"date" in answer.headers and b"x-request-id" in answer.headers
        assert b"connection" not in answer.headers
    assert streamed.status == 200
    assert streamed.headers[b"transfer-encoding"] == b"chunked"
    assert streamed.headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert sse_payloads(streamed.body) == [*CHUNKS, b"[DONE]"]
    assert len(direct_cycles) == 3


async def test_pipelined_requests_are_answered_in_order(
    gateway: GatewayServer, direct_cycles: list[DirectCycle]
) -> None:
    other = json.dumps({"model": "unknown", "messages": []}).encode()
    answers = await exchange(
        gateway, post("/v1/chat/completions", CHAT) + post("/v1/chat/completions", other), 2
    )
    assert [answer.status for answer in answers] == [200, 404]
    assert b"model_not_found" in answers[1].body
    assert len(direct_cycles) == 1  # the second waited behind the first in uvicorn's queue


@pytest.mark.parametrize(
    ("data", "expected_status"),
    [
        (post("/v1/chat/completions", CHAT, "expect: 100-continue"), 200),
        (post("/v1/chat/completions?trace=1", CHAT), 200),
        (post("/v1/chat/completions", CHAT, version="1.0"), 200),
        (b"GET /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n\r\n", 405),
        (post("/v1/models", b"{}"), 405),
    ],
    ids=["expect-continue", "query-string", "http-1.0", "get", "other-path"],
)
async def test_unusual_requests_go_through_uvicorns_cycle(
    gateway: GatewayServer, direct_cycles: list[DirectCycle], data: bytes, expected_status: int
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        writer.write(data)
        answer = await asyncio.wait_for(read_response(reader), 5)
        if answer.status == 100:
            answer = await asyncio.wait_for(read_response(reader), 5)
    finally:
        writer.close()
    assert answer.status == expected_status
    if expected_status == 200:
        assert answer.body == BODY
    assert direct_cycles == []


async def test_a_chunked_request_body_goes_through_uvicorns_cycle(
    gateway: GatewayServer, direct_cycles: list[DirectCycle]
) -> None:
    half = len(CHAT) // 2
    chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, CHAT[:half], len(CHAT) - half, CHAT[half:])
    (answer,) = await exchange(gateway, post("/v1/chat/completions", chunks, "transfer-encoding: chunked"))
    assert (answer.status, answer.body) == (200, BODY)
    assert direct_cycles == []


async def test_connection_close_and_errors_are_answered_as_before(
    gateway: GatewayServer, direct_cycles: list[DirectCycle]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        writer.write(post("/v1/chat/completions", CHAT, "connection: close"))
        answer = await asyncio.wait_for(read_response(reader), 5)
        assert answer.headers[b"connection"] == b"close"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the server closed the connection
    finally:
        writer.close()
    (too_large,) = await exchange(gateway, post("/v1/chat/completions", b"x" * (MAX_BODY + 1)))
    (bad_json,) = await exchange(gateway, post("/v1/chat/completions", b"{not json"))
    assert (answer.status, too_large.status, bad_json.status) == (200, 413, 400)
    assert json.loads(too_large.body)["error"]["type"] == "invalid_request_error"
    assert len(direct_cycles) == 3


async def test_a_request_split_over_several_reads_is_read_plain(
    gateway: GatewayServer, direct_cycles: list[DirectCycle]
) -> None:
    data = post("/v1/chat/completions", CHAT)
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        for cut in (10, len(data) - len(CHAT) + 5):  # inside the head, then inside the body
            writer.write(data[:cut])
            await writer.drain()
            await asyncio.sleep(0.05)
            data = data[cut:]
        writer.write(data)
        answer = await asyncio.wait_for(read_response(reader), 5)
    finally:
        writer.close()
    assert (answer.status, answer.body) == (200, BODY)
    assert len(direct_cycles) == 1


async def test_a_connection_leaves_the_plain_reader_for_good_at_its_first_unusual_request(
    gateway: GatewayServer, direct_cycles: list[DirectCycle]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    answers = []
    try:
        for data in (
            post("/v1/chat/completions", CHAT),
            b"GET /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n\r\n",
            post("/v1/chat/completions", CHAT),
            post("/v1/chat/completions?x=1", CHAT),
            post("/v1/completions", json.dumps({"model": "m", "prompt": "hi"}).encode()),
        ):
            writer.write(data)
            answers.append(await asyncio.wait_for(read_response(reader), 5))
    finally:
        writer.close()
    assert [answer.status for answer in answers] == [200, 405, 200, 200, 200]
    assert all(answer.body == BODY for answer in answers if answer.status == 200)
    assert len(direct_cycles) == 3  # the plain POSTs, before and after (through httptools) the GET


async def test_an_idle_plain_connection_is_closed_after_the_keep_alive_timeout() -> None:
    server = GatewayServer(create_app(Settings(), router=scripted_pool([ScriptedEngine()])), keep_alive_s=0.3)
    server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            for _ in range(3):  # a busy connection stays open past the timeout
                writer.write(post("/v1/chat/completions", CHAT))
                assert (await asyncio.wait_for(read_response(reader), 5)).status == 200
                await asyncio.sleep(0.2)
            started = asyncio.get_running_loop().time()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
            assert asyncio.get_running_loop().time() - started < 2
        finally:
            writer.close()
    finally:
        server.stop()


def test_header_checks_reject_the_bytes_uvicorns_expressions_reject() -> None:
    from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE

    from proxy.direct_cycle import _invalid_name, _invalid_value

    for byte in range(256):
        text = b"a" + bytes([byte]) + b"b"
        assert _invalid_name(text) == bool(HEADER_RE.search(text)), byte
        assert _invalid_value(text) == bool(HEADER_VALUE_RE.search(text)), byte
