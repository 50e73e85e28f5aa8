"""A scripted HTTP/1.1 server on loopback for the transport tests: it parses each request with
httptools and lets the test decide, per request, what bytes go back and whether the connection ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httptools


@dataclass(slots=True)
class Received:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int
    """Which accepted connection (0, 1, ...) carried it."""
    index_on_connection: int


@dataclass(slots=True)
class Exchange:
    """What a responder gets: the request and the socket to answer on."""

    request: Received
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


Responder = Callable[[Exchange], Awaitable[bool]]
"""Writes the answer; returns False to close the connection afterwards."""


@dataclass(slots=True)
class Server:
    port: int
    received: list[Received] = field(default_factory=list)
    connections: int = 0
    closed_by_peer: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class _RequestParser:
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.done: list[tuple[str, str, dict[str, str], bytes]] = []
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._url = b""

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode()
        self.done.append((method, self._url.decode(), self._headers, bytes(self._body)))
        self._headers, self._body, self._url = {}, bytearray(), b""


@asynccontextmanager
async def serve(respond: Responder, *, read_requests: bool = True) -> AsyncIterator[Server]:
    """A server on 127.0.0.1 (random port) answering every request with `respond`; with
    `read_requests=False` it accepts connections and never reads from them."""
    state = Server(port=0)
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = state.connections
        state.connections += 1
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            if not read_requests:
                await asyncio.sleep(3600)
            parser = _RequestParser()
            index = 0
            while True:
                data = await reader.read(65536)
                if not data:
                    state.closed_by_peer.set()
                    return
                parser.parser.feed_data(data)
                while parser.done:
                    method, path, headers, body = parser.done.pop(0)
                    request = Received(method, path, headers, body, number, index)
                    index += 1
                    state.received.append(request)
                    if not await respond(Exchange(request, reader, writer)):
                        return
        except ConnectionError:
            state.closed_by_peer.set()
        except asyncio.CancelledError:
            return
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def response(body: bytes, *, status: int = 200, headers: str = "") -> bytes:
    """A whole response with a Content-Length."""
    return f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n{headers}\r\n".encode() + body


async def answer(exchange: Exchange, data: bytes, *, keep_open: bool = True) -> bool:
    exchange.writer.write(data)
    await exchange.writer.drain()
    return keep_open
