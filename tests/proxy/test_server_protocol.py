"""`HeadWithBodyTransport`: a response head leaves with the body written after it, in order."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx

from proxy.server_protocol import GatewayHttpProtocol, HeadWithBodyTransport
from tests.gateway_server import GatewayServer

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8080) if name == "sockname" else default


def wrap(transport: RecordingTransport) -> HeadWithBodyTransport:
    return HeadWithBodyTransport(cast(asyncio.Transport, transport), asyncio.get_running_loop())


async def test_head_and_body_leave_in_one_write() -> None:
    transport = RecordingTransport()
    wrapped = wrap(transport)
    wrapped.write(HEAD)
    assert transport.writes == []
    wrapped.write(b"{}")
    assert transport.writes == [HEAD + b"{}"]
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert transport.writes == [HEAD + b"{}"]


async def test_a_head_without_body_leaves_on_the_next_loop_turn() -> None:
    transport = RecordingTransport()
    wrapped = wrap(transport)
    wrapped.write(HEAD)
    await asyncio.sleep(0)
    assert transport.writes == [HEAD]
    wrapped.write(b"{}")
    assert transport.writes == [HEAD, b"{}"]


async def test_close_sends_a_held_head_first() -> None:
    transport = RecordingTransport()
    wrapped = wrap(transport)
    wrapped.write(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n")
    wrapped.close()
    assert transport.writes == [b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n"]
    assert transport.closed


async def test_body_bytes_pass_straight_through_and_other_methods_delegate() -> None:
    transport = RecordingTransport()
    wrapped = wrap(transport)
    wrapped.write(b"data: {}\n\n")
    assert transport.writes == [b"data: {}\n\n"]
    assert wrapped.get_extra_info("sockname") == ("127.0.0.1", 8080)


async def test_served_responses_are_whole_through_the_protocol() -> None:
    """JSON, chunked and empty answers of a plain ASGI app, over keep-alive, under uvicorn."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/json":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"{}"})
        elif path == "/chunks":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for part in (b"a", b"b", b"c"):
                await asyncio.sleep(0.01)  # the head leaves before the first chunk
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    server = GatewayServer(cast(Any, app)).start()
    try:
        assert server._server.config.http is GatewayHttpProtocol
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            for _ in range(3):
                json_answer = await client.get("/json")
                assert (json_answer.status_code, json_answer.content) == (200, b"{}")
                chunked = await client.get("/chunks")
                assert (chunked.status_code, chunked.content) == (200, b"abc")
                empty = await client.get("/empty")
                assert (empty.status_code, empty.content) == (204, b"")
    finally:
        server.stop()
