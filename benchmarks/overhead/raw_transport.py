"""An httpx transport doing HTTP/1.1 itself: asyncio protocols, httptools parsing, a LIFO pool.

httpx's default transport hands every request to httpcore, which runs h11 (a pure-Python
HTTP/1.1 state machine) over anyio streams and scans its whole connection pool on each
checkout. This transport keeps httpx's client, request and response objects (so the adapters'
code and error handling stay the same) and replaces what lies under them:

    write      one `transport.write` of the request head (+ body when it is in memory)
    parse      httptools' C parser fed from `data_received`; body chunks queue up per response
    pool       per origin, a stack of idle keep-alive connections: checkout pops one
               (discarding any the server closed), checkin pushes it back
    timeouts   httpx's connect/read/write/pool timeouts, each a loop timer, not a task

    client = httpx.AsyncClient(transport=RawTransport(limits=httpx.Limits(...)), ...)
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator
from typing import cast

import httptools
import httpx

_DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection and the response being read on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.idle_since = 0.0
        self._reset()
        self.closed = False
        self.error: Exception | None = None

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.complete = False
        self.keep_alive = False

    # ---- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = httpx.RemoteProtocolError(f"invalid HTTP response: {exc}")
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.error is None:
            message = "server disconnected without sending a complete response"
            self.error = httpx.RemoteProtocolError(message) if exc is None else httpx.ReadError(str(exc))
        self._wake()

    # ---- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful inside this callback

    # ---- used by the transport ----------------------------------------------------------------

    def reusable(self) -> bool:
        return not self.closed and self.error is None and self.transport is not None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, timeout_s: float | None) -> None:
        """Until more of the response arrived, the connection failed, or `timeout` passed."""
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        self.waiter = waiter = loop.create_future()
        fired = False

        def expire() -> None:
            nonlocal fired
            fired = True
            waiter.cancel()

        handle = loop.call_later(timeout_s, expire) if timeout_s is not None else None
        try:
            await waiter
        except asyncio.CancelledError:
            if fired:
                raise httpx.ReadTimeout("timed out waiting for the upstream") from None
            raise
        finally:
            if handle is not None:
                handle.cancel()
            self.waiter = None
        if self.error is not None:
            raise self.error


class _Body(httpx.AsyncByteStream):
    """A response body read from its connection; closing it returns or closes the connection."""

    def __init__(
        self, transport: RawTransport, origin: Origin, conn: _Connection, timeout: float | None
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._conn = conn
        self._timeout = timeout
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.chunks.popleft()
            elif conn.complete:
                return
            else:
                await conn.wait(self._timeout)

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._transport._release(self._origin, self._conn)


class RawTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 to any number of origins with `limits` (max connections, keep-alive, expiry)."""

    def __init__(
        self, *, limits: httpx.Limits | None = None, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        limits = limits or httpx.Limits()
        self._max_connections = limits.max_connections
        self._max_idle = limits.max_keepalive_connections
        self._expiry = limits.keepalive_expiry
        self._ssl = ssl_context
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open = 0
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        origin = (url.scheme, url.host, url.port or _DEFAULT_PORTS[url.scheme])
        conn = self._checkout(origin)
        if conn is None:
            await self._reserve_slot(timeouts.get("pool"))
            try:
                conn = await self._connect(origin, timeouts.get("connect"))
            except BaseException:
                self._free_slot()
                raise
        read_timeout = timeouts.get("read")
        try:
            await self._send(conn, request)
            while not conn.head_done:
                await conn.wait(read_timeout)
        except BaseException:
            conn.close()
            self._free_slot()
            raise
        return httpx.Response(
            conn.status,
            headers=conn.headers,
            stream=_Body(self, origin, conn, read_timeout),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for conn in connections:
                conn.close()
        self._idle.clear()

    # ---- pool ------------------------------------------------------------------------------

    def _checkout(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if (
                conn.reusable()
                and not conn.chunks
                and (self._expiry is None or now - conn.idle_since < self._expiry)
            ):
                conn._reset()
                return conn
            conn.close()
            self._free_slot()
        return None

    def _release(self, origin: Origin, conn: _Connection) -> None:
        if conn.complete and conn.keep_alive and conn.reusable():
            idle = self._idle.setdefault(origin, [])
            if self._max_idle is None or len(idle) < self._max_idle:
                conn.idle_since = time.monotonic()
                idle.append(conn)
                return
        conn.close()
        self._free_slot()

    async def _reserve_slot(self, timeout_s: float | None) -> None:
        if self._max_connections is None or self._open < self._max_connections:
            self._open += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            raise httpx.PoolTimeout("no connection became free in time") from None
        finally:
            if waiter in self._slot_waiters:
                self._slot_waiters.remove(waiter)
        self._open += 1

    def _free_slot(self) -> None:
        self._open -= 1
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connect(self, origin: Origin, timeout_s: float | None) -> _Connection:
        scheme, host, port = origin
        ssl_context = (self._ssl or ssl.create_default_context()) if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, host, port, ssl=ssl_context), timeout_s
            )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        return conn

    async def _send(self, conn: _Connection, request: httpx.Request) -> None:
        """Write the request; the transport buffers it (request bodies are bounded by the gateway)."""
        transport = conn.transport
        if transport is None or transport.is_closing():
            raise httpx.WriteError("the connection is closed")
        target = request.url.raw_path
        head = [request.method.encode(), b" ", target, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        stream = request.stream
        if isinstance(stream, httpx.ByteStream):
            transport.write(b"".join(head) + bytes(stream._stream))  # one write for head and body
            return
        transport.write(b"".join(head))
        chunked = request.headers.get("transfer-encoding") == "chunked"
        async for part in cast(httpx.AsyncByteStream, stream):
            transport.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
        if chunked:
            transport.write(b"0\r\n\r\n")
