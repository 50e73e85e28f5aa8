"""`FastTransport`: httpx's transport interface over `Connection` and `ConnectionPool`."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import httpx

from adapters.http_transport.connection import Connection, LostCallback, Origin
from adapters.http_transport.exchange import ResponseBody, request_head, send_streamed_request
from adapters.http_transport.pool import ConnectionPool, PoolLimits

RETRYABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
"""Idempotent methods: the only ones sent again after a stale keep-alive connection (see `FastTransport`)."""
_HTTP_VERSION = b"HTTP/1.1"


class Timeouts(NamedTuple):
    """httpx's per-request `timeout` extension; None waits forever."""

    connect: float | None
    read: float | None
    write: float | None
    pool: float | None

    @classmethod
    def of(cls, request: httpx.Request) -> Timeouts:
        given = request.extensions.get("timeout", {})
        return cls(given.get("connect"), given.get("read"), given.get("write"), given.get("pool"))


class WholeResponse(NamedTuple):
    """A response read whole by `FastTransport.send_whole`: its body exactly as received."""

    status: int
    headers: list[tuple[bytes, bytes]]
    """As received (names in the upstream's case)."""
    body: bytes


class FastTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 for `httpx.AsyncClient` without httpcore: asyncio protocols, httptools, an O(1) pool.

    `limits` works as for httpx's transport (max connections, max keep-alive, keep-alive expiry),
    timeouts come from each request as httpx sets them, errors are httpx's exceptions.
    https URLs go to httpx's own transport (TLS, HTTP/2 and certificates stay httpx's business).

    A keep-alive connection the server closes just as it is reused fails with no byte of
    response received. Such a request is sent again once, on a new connection, only if its
    method is idempotent and its body is in memory: a POST may have reached the server (which
    may have started generating), so it fails instead and the router's retry decides. The pool
    expires idle connections before the usual 5 s server idle timeout to make that race rare.
    """

    def __init__(self, *, limits: httpx.Limits | None = None) -> None:
        self._limits = limits or httpx.Limits()
        self._pool = ConnectionPool(PoolLimits.of(self._limits))
        self._tls: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            return await self._tls_transport().handle_async_request(request)
        timeouts = Timeouts.of(request)
        origin = Origin(url.host, url.port or 80)
        conn = await self._checkout(origin, timeouts, fresh=False)
        try:
            await self._exchange(conn, request, timeouts)
        except httpx.TransportError as exc:
            self._pool.discard(conn)
            if not _may_retry(conn, request, exc):
                raise
            conn = await self._checkout(origin, timeouts, fresh=True)
            try:
                await self._exchange(conn, request, timeouts)
            except BaseException:
                self._pool.discard(conn)
                raise
        except BaseException:  # cancelled: the connection is mid-exchange, it cannot be reused
            self._pool.discard(conn)
            raise
        return httpx.Response(
            conn.status,
            headers=conn.headers,
            stream=ResponseBody(conn, timeouts.read, self._pool.release),
            extensions={"http_version": _HTTP_VERSION, "reason_phrase": conn.reason},
        )

    async def send_whole(self, origin: Origin, data: bytes, timeouts: Timeouts) -> WholeResponse:
        """Write `data`, a complete request (head and body), to `origin` and read the whole answer,
        without httpx's `Request`/`Response` objects (the request path's POSTs; at a steady rate
        their construction cost as much as the exchange). A POST is never sent twice: a stale
        connection fails it like any transport error, and the router's retry decides."""
        conn = await self._checkout(origin, timeouts, fresh=False)
        parts: list[bytes] = []
        try:
            conn.start_response(head_only=False)
            conn.write(data)
            await conn.drain(timeouts.write)
            while True:
                while conn.chunks:  # drained as it comes: a paused socket resumes below the low water
                    parts.append(conn.next_chunk())
                if conn.complete:
                    break
                await conn.wait_readable(timeouts.read)
        except BaseException:
            self._pool.discard(conn)
            raise
        self._pool.release(conn)
        return WholeResponse(conn.status, conn.headers, b"".join(parts))

    async def aclose(self) -> None:
        self._pool.close()
        if self._tls is not None:
            await self._tls.aclose()

    async def _checkout(self, origin: Origin, timeouts: Timeouts, *, fresh: bool) -> Connection:
        """An idle connection (unless `fresh`), else a new one once the pool allows it."""
        conn = None if fresh else self._pool.take_idle(origin)
        if conn is None:
            conn = await self._pool.reserve(origin, timeouts.pool)
        if conn is not None:
            return conn
        try:
            conn = await _connect(origin, timeouts.connect, self._pool.forget)
        except BaseException:
            self._pool.free_slot()
            raise
        self._pool.opened(conn, origin)
        return conn

    async def _exchange(self, conn: Connection, request: httpx.Request, timeouts: Timeouts) -> None:
        """Send `request` and read up to the end of the response head."""
        conn.start_response(head_only=request.method == "HEAD")
        stream = request.stream
        if isinstance(stream, httpx.ByteStream):  # in memory: head and body in one write
            conn.write(request_head(request) + b"".join(stream))
        else:
            await send_streamed_request(conn, request, timeouts.write)
        await conn.drain(timeouts.write)
        while not conn.head_done:
            await conn.wait_readable(timeouts.read)

    def _tls_transport(self) -> httpx.AsyncHTTPTransport:
        if self._tls is None:
            self._tls = httpx.AsyncHTTPTransport(limits=self._limits)
        return self._tls


async def _connect(origin: Origin, timeout_s: float | None, on_lost: LostCallback) -> Connection:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            _, conn = await loop.create_connection(lambda: Connection(on_lost), origin.host, origin.port)
    except TimeoutError:  # before OSError: TimeoutError is one
        raise httpx.ConnectTimeout(f"connecting to {origin.host}:{origin.port} timed out") from None
    except OSError as exc:
        raise httpx.ConnectError(f"cannot connect to {origin.host}:{origin.port}: {exc}") from exc
    return conn


def _may_retry(conn: Connection, request: httpx.Request, exc: httpx.TransportError) -> bool:
    """A reused connection that died before any byte of response: the server had closed it."""
    return (
        conn.reused
        and conn.received_bytes == 0
        and isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError)
        and request.method in RETRYABLE_METHODS
        and isinstance(request.stream, httpx.ByteStream)
    )
