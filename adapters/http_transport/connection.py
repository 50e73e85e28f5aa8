"""One HTTP/1.1 client connection: an asyncio protocol feeding httptools' C parser.

The protocol holds the state of the response being read (status, headers, queued body chunks)
and two wake-ups: one for the reader (more of the response arrived, or the connection failed)
and one for the writer (the socket's send buffer drained). Errors are httpx's own exceptions, so
callers see the same types as with httpx's default transport:

    invalid response bytes                       -> RemoteProtocolError
    server closed before the response was whole  -> RemoteProtocolError (ReadError if the socket failed)
    no byte within the read timeout              -> ReadTimeout
    send buffer not drained within write timeout -> WriteTimeout
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import NamedTuple, cast

import httptools
import httpx

READ_HIGH_WATER_BYTES = 1 << 20
"""Body bytes queued unread before the socket stops reading (the upstream then waits on TCP)."""
READ_LOW_WATER_BYTES = 1 << 18
"""Queued bytes below which reading resumes."""
_UPGRADE = 101


class Origin(NamedTuple):
    """Where a connection goes (plain HTTP only: https requests take httpx's own transport)."""

    host: str
    port: int


LostCallback = Callable[["Connection"], None]
"""Told when a connection closes, whoever closed it."""


class Connection(asyncio.Protocol):
    """An HTTP/1.1 connection and the one response in flight on it."""

    def __init__(self, on_lost: LostCallback | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.error: httpx.TransportError | None = None
        self.idle_since = 0.0
        self.reused = False
        """True once the connection served a response; only reused connections can be stale."""
        self._on_lost = on_lost
        self._parser = httptools.HttpResponseParser(self)
        self._read_waiter: asyncio.Future[None] | None = None
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_deadline = 0.0
        self._read_timed_out = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._read_paused = False
        self.origin = Origin("", 0)
        self.holds_slot = False
        """Pool bookkeeping: the connection counts against `max_connections`."""
        self.in_pool = False
        """Pool bookkeeping: the connection sits idle in the pool."""
        self.start_response(head_only=False)

    def start_response(self, *, head_only: bool) -> None:
        """Forget the previous response; `head_only` for a HEAD request, whose answer has no body."""
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.received_bytes = 0
        self._head_only = head_only
        self._until_eof = False

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        self.received_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # what a callback below raised
            self._fail(
                cause
                if isinstance(cause, httpx.TransportError)
                else httpx.RemoteProtocolError(f"invalid HTTP response from the upstream: {exc}")
            )
        self._wake_reader()

    def eof_received(self) -> bool | None:
        return None  # close the transport: a half-closed HTTP/1.1 connection cannot be reused

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_read_timer()
        if self.head_done and not self.complete and self._until_eof and exc is None:
            self.complete = True  # a body without length or chunks ends where the connection does
        elif not self.complete and self.error is None:
            self.error = (
                httpx.ReadError(f"the upstream connection failed: {exc}")
                if exc is not None
                else httpx.RemoteProtocolError(
                    "the upstream closed the connection without a complete response"
                )
            )
        self._wake_reader()
        self._wake_writer()
        if self._on_lost is not None:
            self._on_lost(self)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    # ---- httptools callbacks -----------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status == _UPGRADE:
            raise httpx.RemoteProtocolError("the upstream switched protocols, which is not supported")
        if status < 200:
            return  # 1xx: informational, its message completes at once and the real answer follows
        self.status = status
        self.head_done = True
        framed = False  # a length or chunks; without either, llhttp reads the body until EOF, which
        for name, _ in self.headers:  # httptools cannot signal: connection_lost does
            name = name.lower()
            if name == b"content-length" or name == b"transfer-encoding":
                framed = True
                break
        self._until_eof = not framed and status not in (204, 304) and not self._head_only
        if self._head_only:
            self.complete = True  # the parser would wait for the announced body; the connection is closed

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > READ_HIGH_WATER_BYTES and not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if not self.head_done:
            self.headers = []  # the end of a 1xx message
            return
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive() and not self._head_only

    # ---- used by the transport ---------------------------------------------------------------

    def reusable(self) -> bool:
        """True when the last response was read whole and the server allows another one."""
        return (
            self.complete and self.keep_alive and not self.chunks and not self.closed and self.error is None
        )

    def next_chunk(self) -> bytes:
        """Pop one queued body chunk, resuming a paused socket once the queue is short."""
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self._read_paused and self.buffered < READ_LOW_WATER_BYTES and self.transport is not None:
            self._read_paused = False
            self.transport.resume_reading()
        return chunk

    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise self.error or httpx.WriteError("the upstream connection is closed")
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        self._stop_read_timer()
        if self.transport is not None:
            self.transport.close()

    def _stop_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    async def wait_readable(self, timeout_s: float | None) -> None:
        """Until more of the response arrived, the connection failed, or `timeout_s` passed.

        The timeout is one timer per connection that re-arms itself while a wait is in progress
        (`_read_timer_due`), not a timer per wait: the waits of a keep-alive connection rarely
        last long, and a timer made and cancelled per request costs a request's CPU at low rates."""
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        self._read_waiter = waiter = loop.create_future()
        if timeout_s is not None:
            deadline = self._read_deadline = loop.time() + timeout_s
            timer = self._read_timer
            if timer is None or timer.when() > deadline:
                if timer is not None:
                    timer.cancel()
                self._read_timer = loop.call_at(deadline, self._read_timer_due)
        try:
            await waiter
        except asyncio.CancelledError:
            if self._read_timed_out:
                self._read_timed_out = False
                raise httpx.ReadTimeout("timed out waiting for the upstream's answer") from None
            raise
        finally:
            self._read_waiter = None
        if self.error is not None:
            raise self.error

    def _read_timer_due(self) -> None:
        self._read_timer = None
        waiter = self._read_waiter
        if waiter is None or waiter.done():
            return  # no wait in progress: the next one arms the timer again
        loop = waiter.get_loop()
        if loop.time() >= self._read_deadline:
            self._read_timed_out = True
            waiter.cancel()
        else:
            self._read_timer = loop.call_at(self._read_deadline, self._read_timer_due)

    async def drain(self, timeout_s: float | None) -> None:
        """Until the send buffer is below its high-water mark (asyncio's flow control)."""
        if self._write_paused and not self.closed:
            self._drain_waiter = waiter = asyncio.get_running_loop().create_future()
            try:
                await _wait(waiter, timeout_s, httpx.WriteTimeout, "timed out sending the request upstream")
            finally:
                self._drain_waiter = None
        if self.closed and not self.head_done:
            raise self.error or httpx.WriteError("the upstream closed the connection during the request")

    def _fail(self, error: httpx.TransportError) -> None:
        if self.error is None:
            self.error = error
        self.close()

    def _wake_reader(self) -> None:
        if self._read_waiter is not None and not self._read_waiter.done():
            self._read_waiter.set_result(None)

    def _wake_writer(self) -> None:
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)


async def _wait(
    waiter: asyncio.Future[None],
    timeout_s: float | None,
    timeout_error: type[httpx.TimeoutException],
    message: str,
) -> None:
    """Await `waiter`, raising `timeout_error` after `timeout_s`: a loop timer, cheaper than a task."""
    if timeout_s is None:
        await waiter
        return
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        waiter.cancel()

    handle = asyncio.get_running_loop().call_later(timeout_s, expire)
    try:
        await waiter
    except asyncio.CancelledError:
        if fired:
            raise timeout_error(message) from None
        raise
    finally:
        handle.cancel()
