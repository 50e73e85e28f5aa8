"""A leaner request/response cycle for the generation routes, started by `GatewayHttpProtocol`.

uvicorn's `RequestResponseCycle` serves any ASGI app over any request. `GatewayHttpProtocol`
(`proxy.server_protocol`) starts a `DirectCycle` instead for the plain requests of the two
generation routes (see `GatewayHttpProtocol.direct_route`), and runs the route that
`FastRoutes.direct_routes` gives for the path, without `FastRoutes`'s dispatch in between.

What it leaves out is what these requests cannot need: no `Expect: 100-continue`, no HEAD,
no 204/304, a body delivered without waiting when it is complete before the route asks for it,
and the server's default headers (the `Date`) encoded once per second instead of once per
request. What it keeps is uvicorn's: the same status lines, header checks, `Content-Length`
or chunked framing, `Connection: close` when the connection is not kept alive, write flow
control, the access log line, and the protocol's bookkeeping (keep-alive timer, pipelining,
graceful shutdown), which reads the attributes named as uvicorn's cycle names them.
At 100 requests/s every request runs on cold caches after an idle wake, and its CPU time follows
the code and objects it touches more than its bytecodes (`benchmarks/RESULTS.md`, "## overhead").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from uvicorn._types import ASGIReceiveEvent, ASGISendEvent, HTTPScope
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr

_CHUNKED_END = b"0\r\n\r\n"


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
                if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
                    raise RuntimeError(f"Invalid default HTTP header {name!r}.")
            self._lines = b"".join(b"%s: %s\r\n" % (name.lower(), value) for name, value in headers)
            self._source = headers
        return self._lines


class DirectCycle(RequestResponseCycle):
    """One request of a generation route and its response (see the module docstring).

    `run_asgi`, `send_500_response` and the error handling are uvicorn's; `receive` and `send`
    are this class's. It is also the request's `ResponseStatus` (`proxy.asgi_types`), so the route's
    middleware need not wrap `send` to learn the status.
    """

    def __init__(
        self,
        scope: HTTPScope,
        transport: asyncio.Transport,
        flow: FlowControl,
        *,
        keep_alive: bool,
        default_head: bytes,
        logger: logging.Logger,
        access_logger: logging.Logger,
        access_log: bool,
        on_response: Callable[[], None],
    ) -> None:
        # Not `RequestResponseCycle.__init__`: the same attributes, without those this class never reads.
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.logger = logger
        self.access_logger = access_logger
        self.access_log = access_log
        self.default_head = default_head
        self.message_event = asyncio.Event()
        self.on_response = on_response
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = False
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0
        self.status = 0
        """The response's status once the app has sent `http.response.start` (a `ResponseStatus`)."""

    async def receive(self) -> ASGIReceiveEvent:
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            event = self.message_event
            if not event.is_set():  # the whole body usually came with the head: no wait
                await event.wait()
            event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body, self.body = bytes(self.body), bytearray()
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: ASGISendEvent) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
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
            if self.access_log:
                self._log(self.status)
            self.transport.write(self._head(self.status, message.get("headers", ())))
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
            self.transport.write(data)
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            self.transport.write(body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    def _head(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        """The status line and headers as uvicorn writes them (a POST's answer: never HEAD, 204 or 304)."""
        content = [STATUS_LINE[status], self.default_head]
        closing = False
        for name, value in headers:
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
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
        self.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(scope),
            scope["method"],
            scope["path"],  # the direct routes take no query string
            scope["http_version"],
            status,
        )
