"""An httpcore network backend on plain asyncio protocols, for httpx clients on asyncio/uvloop.

httpx 0.28 drives httpcore, whose asyncio support goes through anyio: every read and write
enters a cancel scope (`anyio.fail_after`), and every pool checkout asks anyio for a dict of
socket attributes then polls the socket to see whether an idle connection was closed. This
backend does the same job with one `asyncio.Protocol` per connection: bytes are buffered as
they arrive, a read waits on one future with a timer for its timeout, and "is the idle
connection readable" is a field lookup (buffered bytes or EOF) rather than a system call.

    transport = fast_transport(limits=..., ...)     # an httpx.AsyncHTTPTransport using it
    client = httpx.AsyncClient(transport=transport, ...)
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import typing
from typing import Any, cast

import httpcore
import httpx

_HIGH_WATER = 64 * 1024


class _StreamProtocol(asyncio.Protocol):
    __slots__ = ("_buffer", "_closed", "_drained", "_eof", "_error", "_paused", "_waiter", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._error: Exception | None = None
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        self._buffer.append(data)
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._closed = True
        self._error = exc
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


async def _wait(future: asyncio.Future[None], timeout: float | None, timeout_error: type[Exception]) -> None:  # noqa: ASYNC109
    """Await `future`, cancelling it after `timeout` seconds (a timer, not a task per wait)."""
    if timeout is None:
        await future
        return
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        future.cancel()

    handle = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        await future
    except asyncio.CancelledError:
        if fired:
            raise timeout_error() from None
        raise
    finally:
        handle.cancel()


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One TCP connection."""

    def __init__(self, protocol: _StreamProtocol) -> None:
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        protocol = self._protocol
        while not protocol._buffer:
            if protocol._eof:
                if protocol._error is not None:
                    raise httpcore.ReadError(str(protocol._error))
                return b""
            protocol._waiter = asyncio.get_running_loop().create_future()
            await _wait(protocol._waiter, timeout, httpcore.ReadTimeout)
        data = protocol._buffer.popleft()
        if len(data) > max_bytes:
            protocol._buffer.appendleft(data[max_bytes:])
            data = data[:max_bytes]
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        protocol = self._protocol
        if not buffer:
            return
        if protocol._closed or protocol.transport is None or protocol.transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        protocol.transport.write(buffer)
        if protocol._paused:
            protocol._drained = asyncio.get_running_loop().create_future()
            await _wait(protocol._drained, timeout, httpcore.WriteTimeout)

    async def aclose(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        transport = self._protocol.transport
        assert transport is not None
        protocol = _StreamProtocol()
        try:
            tls_transport = await asyncio.wait_for(
                loop.start_tls(transport, protocol, ssl_context, server_hostname=server_hostname), timeout
            )
        except TimeoutError:
            raise httpcore.ConnectTimeout("TLS handshake timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        assert tls_transport is not None
        protocol.connection_made(tls_transport)
        return AsyncioStream(protocol)

    def get_extra_info(self, info: str) -> Any:
        protocol = self._protocol
        if info == "is_readable":
            # An idle keep-alive connection is "readable" only when the server sent EOF or bytes.
            return bool(protocol._buffer) or protocol._eof
        transport = protocol.transport
        if transport is None:
            return None
        if info == "ssl_object":
            return transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Opens `AsyncioStream`s with `loop.create_connection` (TCP_NODELAY is asyncio's default)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: typing.Iterable[tuple[int, int, int] | tuple[int, int, bytes | bytearray]]
        | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    _StreamProtocol,
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                ),
                timeout,
            )
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        if socket_options and protocol.transport is not None:
            sock = protocol.transport.get_extra_info("socket")
            for option in socket_options:
                sock.setsockopt(*option)
        protocol.transport.set_write_buffer_limits(high=_HIGH_WATER)  # type: ignore[union-attr]
        return AsyncioStream(protocol)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: typing.Iterable[tuple[int, int, int] | tuple[int, int, bytes | bytearray]]
        | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(loop.create_unix_connection(_StreamProtocol, path), timeout)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connecting to {path} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return AsyncioStream(protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def fast_transport(*, limits: httpx.Limits, http2: bool = False) -> httpx.AsyncHTTPTransport:
    """`httpx.AsyncHTTPTransport` whose connection pool runs on `AsyncioBackend`."""
    transport = httpx.AsyncHTTPTransport(limits=limits, http2=http2, trust_env=False)
    # httpx 0.28 does not take a network backend; its transport keeps the httpcore pool in `_pool`.
    transport._pool = httpcore.AsyncConnectionPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        http1=True,
        http2=http2,
        network_backend=AsyncioBackend(),
    )
    return transport


__all__ = ["AsyncioBackend", "AsyncioStream", "fast_transport"]
