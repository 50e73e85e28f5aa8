"""A leaner request/response cycle for the generation routes, started by `GatewayHttpProtocol`.

uvicorn's `RequestResponseCycle` serves any ASGI app over any request. `GatewayHttpProtocol`
(`proxy.server_protocol`) starts a `DirectCycle` instead for the plain requests of the two
generation routes (read by `proxy.plain_request`, or by httptools when `direct_route` says the
request is plain), and runs the route that `FastRoutes.direct_routes` gives for the path, without
`FastRoutes`'s dispatch in between.

What it leaves out is what these requests cannot need:
- no `Expect: 100-continue`, no HEAD, no 204/304;
- a body delivered without waiting when it is complete before the route asks for it, and no
  `asyncio.Event` unless the route waits on the request (`message_event`);
- the server's default headers (the `Date`) encoded once per second, not once per request;
- no done callback on the route's task: `run` leaves the server's task set itself.
The response head is held until the first body message and leaves with it in one write (the
routes send that message right after the head: the JSON body, or a stream's first event); the
cycle writes to the connection's own transport, not through `HeadWithBodyTransport`.

What it keeps is uvicorn's: the same status lines, header checks, `Content-Length` or chunked
framing, `Connection: close` when the connection is not kept alive, write flow control, the access
log line, the answers to a route that fails (`run`), and the protocol's bookkeeping (keep-alive
timer, pipelining, graceful shutdown), which reads the attributes uvicorn's cycle has.
At 100 requests/s every request runs on cold caches after an idle wake, and its CPU time follows
the code and objects it touches more than its bytecodes (`benchmarks/RESULTS.md`, "## overhead").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from uvicorn._types import ASGI3Application, ASGIReceiveEvent, ASGISendEvent, HTTPScope
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.protocols.utils import get_client_addr

_CHUNKED_END = b"0\r\n\r\n"
_NAME_FORBIDDEN = bytes(range(0x20)) + b'\x7f()<>@,;:[]={} \t\\"'
"""What uvicorn's `HEADER_RE` rejects in a header name; checked with `bytes.translate`, not a regex."""
_VALUE_FORBIDDEN = bytes(range(0x09)) + bytes(range(0x0A, 0x20)) + b"\x7f"
"""What uvicorn's `HEADER_VALUE_RE` rejects in a header value."""


def _invalid_name(name: bytes) -> bool:
    return name.translate(None, _NAME_FORBIDDEN) != name


def _invalid_value(value: bytes) -> bool:
    return value.translate(None, _VALUE_FORBIDDEN) != value


def _nothing() -> None:
    return None


class DefaultHead:
    """The server's default headers (uvicorn's `server_state.default_headers`: the `Date`, which the
    server replaces once a second) as header lines, encoded again only when the list changes."""

    __slots__ = ("_lines", "_source")

    def __init__(self) -> None:
        self._source: list[tuple[bytes, bytes]] | None = None
        self._lines = b""

    def lines(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        if headers is not self._source:
            for name, value in headers:
                if _invalid_name(name) or _invalid_value(value):
                    raise RuntimeError(f"Invalid default HTTP header {name!r}.")
            self._lines = b"".join(b"%s: %s\r\n" % (name.lower(), value) for name, value in headers)
            self._source = headers
        return self._lines


class CycleOwner(Protocol):
    """What a `DirectCycle` reads of the server connection that started it (`GatewayHttpProtocol`)."""

    flow: FlowControl
    logger: logging.Logger
    access_logger: logging.Logger
    access_log: bool

    def on_response_complete(self) -> None: ...


_SERVER_ERROR_HEAD = [
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", b"21"),
    (b"connection", b"close"),
]


class DirectCycle:
    """One request of a generation route and its response (see the module docstring).

    It has the attributes of uvicorn's `RequestResponseCycle` that uvicorn's protocol reads and sets
    (`body`, `more_body`, `response_complete`, `disconnected`, `keep_alive`, `message_event`), in
    slots. `run` handles the route's errors as uvicorn's `run_asgi` does. It is also the request's
    `ResponseStatus` (`proxy.asgi_types`), so the route's middleware need not wrap `send` to learn
    the status.
    """

    __slots__ = (
        "_event",
        "_held",
        "body",
        "chunked_encoding",
        "default_head",
        "disconnected",
        "expected_content_length",
        "keep_alive",
        "more_body",
        "on_response",
        "owner",
        "ready",
        "response_complete",
        "response_started",
        "scope",
        "status",
        "task",
        "transport",
    )

    def __init__(
        self,
        scope: HTTPScope,
        owner: CycleOwner,
        transport: asyncio.Transport,
        keep_alive: bool,
        default_head: bytes,
    ) -> None:
        self.scope = scope
        self.owner = owner
        self.transport = transport
        """The connection's own transport: the cycle holds a response head itself."""
        self.keep_alive = keep_alive
        self.default_head = default_head
        self.on_response: Callable[[], None] = owner.on_response_complete
        self.task: asyncio.Task[None] | None = None
        """The task running `run` (set by the server once it is created)."""
        self._event: asyncio.Event | None = None
        self._held: bytes | None = None
        """The response head, until the first body message: both leave in one write."""
        self.ready = False
        """The whole body is in `body` already (a request read by `proxy.plain_request`)."""
        self.disconnected = False
        self.body: bytes | bytearray = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0
        self.status = 0
        """The response's status once the app has sent `http.response.start` (a `ResponseStatus`)."""

    @property
    def message_event(self) -> asyncio.Event:
        """Set when more of the request arrived or the connection was lost (made when first needed)."""
        event = self._event
        if event is None:
            event = self._event = asyncio.Event()
        return event

    async def run(self, app: ASGI3Application, tasks: set[asyncio.Task[None]]) -> None:
        """Run the route as uvicorn's `run_asgi` does, then leave `tasks` (the server's running
        requests, which a graceful shutdown waits for): no done callback, no loop turn for it."""
        logger = self.owner.logger
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self.transport.close()
        else:
            if not self.response_started and not self.disconnected:
                logger.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self.on_response = _nothing
            if self.task is not None:
                tasks.discard(self.task)

    async def _send_500(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": _SERVER_ERROR_HEAD})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error", "more_body": False})

    async def receive(self) -> ASGIReceiveEvent:
        if self.ready:
            self.ready = False
        elif not self.disconnected and not self.response_complete:
            self.owner.flow.resume_reading()
            event = self.message_event
            if not event.is_set():  # the whole body usually came with the head: no wait
                await event.wait()
            event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body, self.body = bytes(self.body), bytearray()
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: ASGISendEvent) -> None:
        flow = self.owner.flow
        if flow.write_paused and not self.disconnected:
            await flow.drain()
        if message["type"] == "http.response.start":
            self.status = message["status"]  # what the app answered, even to a client that has left
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{message['type']}'."
                )
            self.response_started = True
            if self.owner.access_log:
                self._log(self.status)
            self._held = self._head(self.status, message.get("headers", ()))  # sent with the first body bytes
            return
        if self.response_complete:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, after response already completed."
            )
        if message["type"] != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
        body: bytes = message.get("body", b"")
        more_body: bool = message.get("more_body", False)
        if self.chunked_encoding:
            data = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more_body:
                data += _CHUNKED_END
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            data = body
        held = self._held
        if held is not None:
            self._held = None
            data = held + data
        self.transport.write(data)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            if self._event is not None:
                self._event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    def _head(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        """The status line and headers as uvicorn writes them (a POST's answer: never HEAD, 204 or 304)."""
        content = [STATUS_LINE[status], self.default_head]
        closing = False
        for name, value in headers:
            if _invalid_name(name):
                raise RuntimeError("Invalid HTTP header name.")
            if _invalid_value(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [token.lower().strip() for token in value.split(b",")]:
                self.keep_alive = False
                closing = True
            content.append(b"%s: %s\r\n" % (name, value))
        if not self.keep_alive and not closing:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None:
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _log(self, status: int) -> None:
        scope = self.scope
        self.owner.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(scope),
            scope["method"],
            scope["path"],  # the direct routes take no query string
            scope["http_version"],
            status,
        )
