"""One request/response exchange on a connection: writing the request, streaming the response body."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import cast

import httpx

from adapters.http_transport.connection import Connection


async def send_streamed_request(
    conn: Connection, request: httpx.Request, write_timeout_s: float | None
) -> None:
    """Write `request`, whose body is an async stream, on `conn`, waiting for the socket to drain
    whenever asyncio's flow control says its send buffer is full (so a large body never piles up
    in memory past the high-water mark)."""
    conn.write(request_head(request))
    chunked = request.headers.get("transfer-encoding", "").lower() == "chunked"
    async for part in cast(httpx.AsyncByteStream, request.stream):
        if not part:
            continue
        conn.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
        await conn.drain(write_timeout_s)
    if chunked:
        conn.write(b"0\r\n\r\n")


def request_head(request: httpx.Request) -> bytes:
    """The request line and headers, as httpx prepared them (Host, Content-Length included)."""
    parts = [request.method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


class ResponseBody(httpx.AsyncByteStream):
    """The body of the response on `conn`, chunk by chunk as it arrives.

    Once the body has been read whole, or the stream is closed early, `on_done` gets the
    connection: the pool keeps it if the server allows another request on it, else closes it
    (closing the socket is how the upstream learns that nobody reads the answer anymore)."""

    def __init__(
        self, conn: Connection, read_timeout_s: float | None, on_done: Callable[[Connection], None]
    ) -> None:
        self._conn = conn
        self._read_timeout_s = read_timeout_s
        self._on_done: Callable[[Connection], None] | None = on_done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.next_chunk()
            elif conn.complete:
                self._finish()  # the connection is free before the caller even closes the response
                return
            else:
                await conn.wait_readable(self._read_timeout_s)

    async def aclose(self) -> None:
        self._finish()

    def _finish(self) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done(self._conn)
