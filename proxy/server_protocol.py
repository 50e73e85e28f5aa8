"""uvicorn's httptools protocol, with a shorter path for the generation routes' plain requests.

- Plain requests of the generation routes (`proxy.plain_request`) are read without httptools and run
  in a `DirectCycle` (`proxy.direct_cycle`); a connection's keep-alive timeout is then one timer
  that re-arms itself rather than a timer per response. Any other request goes to httptools and
  uvicorn's cycle, and the connection stays with httptools from then on.
- uvicorn writes the status line and headers the moment an app sends `http.response.start`, and
  uvloop sends every write at once: a JSON answer left as two syscalls and two TCP segments (and
  woke the client twice). `HeadWithBodyTransport` holds a response head back until the next write,
  or until the loop's next turn when no body follows at once, so a head and the body sent right
  after it leave in one write (a `DirectCycle` holds its head itself).

Measured in `benchmarks/RESULTS.md` "## overhead".
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping
from typing import Any

from uvicorn._types import ASGI3Application
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.asgi_types import RESPONSE_STATUS_EXTENSION
from proxy.direct_cycle import DefaultHead, DirectCycle
from proxy.disconnect import DISCONNECT_EXTENSION, ConnectionLossHook
from proxy.plain_request import INCOMPLETE, PlainRequest, read_plain_request, request_lines

_HEAD_START = b"HTTP/1.1 "
_HEAD_END = b"\r\n\r\n"


class HeadWithBodyTransport:
    """Wraps a server connection's transport; every method but `write`/`close` is the wrapped one's.

    A write that is a whole response head (`HTTP/1.1 ...` up to the blank line, as uvicorn writes
    it) is held; the next write goes out joined to it. A callback on the loop's next turn sends a
    head that is still held then (an app that waits before its first body bytes), and `close`
    sends it before closing, so bytes always leave in the order they were written.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data.startswith(_HEAD_START) and data.endswith(_HEAD_END):
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Send a held head now."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:  # asked once per response: not through `__getattr__`
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatewayHttpProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` over a `HeadWithBodyTransport` (pass the class as uvicorn's `http`).

    Each request's scope also carries a `ConnectionLossHook` (`extensions`), fired when the
    connection closes before that request's response is complete: `DisconnectWatch` then needs no
    task of its own per request.

    When the app is a `FastRoutes` (`proxy.fast_routes`), a plain request of a generation route runs
    its route directly in a `DirectCycle` (`direct_route` says which requests are plain); every
    other request, and the lifespan, go through uvicorn's cycle and the whole app as before.

    Until a connection sends anything else, its requests are read by `proxy.plain_request` rather
    than httptools (its bytes are buffered until a request is whole), and its keep-alive timeout is
    one timer that re-arms itself, not a timer per response. The first request that is not plain
    goes to httptools with every byte buffered so far, and the connection stays with httptools.
    """

    _loss_hook: ConnectionLossHook | None = None

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        routes: Mapping[bytes, ASGI3Application] | None = getattr(self.app, "direct_routes", None)
        # A root path or a concurrency limit changes what uvicorn does per request: no direct route then.
        direct = routes is not None and not self.root_path and self.limit_concurrency is None
        self._direct_routes: Mapping[bytes, ASGI3Application] = routes if direct and routes else {}
        self._default_head = DefaultHead()
        self._plain_lines = request_lines(self._direct_routes)
        self._plain = bool(self._plain_lines)
        """The connection's requests are read by `read_plain_request` (until one is not plain)."""
        self._unread = b""
        """The start of a plain request not yet whole."""
        self._active_at = 0.0
        """When the connection last finished a response or received part of a request."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw_transport = transport
        """For `DirectCycle`s, which hold a response head themselves."""
        wrapped = HeadWithBodyTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        if self._plain:
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                if self._unread:
                    data, self._unread = self._unread + data, b""
                request = read_plain_request(data, self._plain_lines)
                if isinstance(request, PlainRequest):
                    self._serve_plain(request)
                    return
                if request is INCOMPLETE:
                    self._unread = data
                    self._active_at = self.loop.time()  # a slow upload is not an idle connection
                    return
            self._plain = False  # httptools from now on, starting with everything buffered
            self._unset_keepalive_if_required()
            if self._unread:
                data, self._unread = self._unread + data, b""
        super().data_received(data)

    def _serve_plain(self, request: PlainRequest[ASGI3Application]) -> None:
        """Start `request`'s route, as `on_message_begin` and `on_headers_complete` would."""
        path = request.path.decode("ascii")
        hook = self._loss_hook = ConnectionLossHook()
        scope: Any = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": request.headers,
            "state": self.app_state.copy(),
            "method": "POST",
            "path": path,
            "raw_path": request.path,
            "query_string": b"",
            "path_template": path,
            "extensions": {DISCONNECT_EXTENSION: {"hook": hook}},
        }
        self.scope = scope
        self.headers = request.headers
        cycle = self._direct_cycle(scope, request.keep_alive)
        cycle.body = request.body  # whole: `receive` hands it over as is
        cycle.more_body = False
        cycle.ready = True
        self._start_direct(cycle, request.route)

    def on_response_complete(self) -> None:
        if not self._plain:
            super().on_response_complete()
            return
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._active_at = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        """The keep-alive timer of a plain connection: close it when it has been idle long enough,
        else look again when it could be (a response in flight re-arms the timer when it ends)."""
        self.timeout_keep_alive_task = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return
        idle = self.loop.time() - self._active_at
        if idle >= self.timeout_keep_alive:
            self.timeout_keep_alive_handler()
        else:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive - idle, self._keep_alive_due
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        hook = self._loss_hook = ConnectionLossHook()
        self.scope["extensions"] = {DISCONNECT_EXTENSION: {"hook": hook}}  # ASGI: an extension is a dict

    def on_headers_complete(self) -> None:
        route = self.direct_route()
        if route is None:
            super().on_headers_complete()
            return
        path = self.url.decode("ascii")
        scope = self.scope
        scope["method"] = "POST"
        scope["path"] = path
        scope["raw_path"] = self.url
        scope["query_string"] = b""
        scope["path_template"] = path  # type: ignore[typeddict-unknown-key]  # as `FastRoutes` sets it
        self._start_direct(self._direct_cycle(scope, self.parser.should_keep_alive()), route)

    def _start_direct(self, cycle: DirectCycle, route: ASGI3Application) -> None:
        """`_start_asgi_task` for a `DirectCycle`: its `run` leaves the server's task set itself."""
        tasks: set[asyncio.Task[None]] = self.tasks
        if self.config.reset_contextvars:
            cycle.task = task = self.loop.create_task(cycle.run(route, tasks), context=contextvars.Context())
        else:
            cycle.task = task = self.loop.create_task(cycle.run(route, tasks))
        tasks.add(task)

    def _direct_cycle(self, scope: Any, keep_alive: bool) -> DirectCycle:
        head = self._default_head.lines(self.server_state.default_headers)
        cycle = DirectCycle(scope, self, self._raw_transport, keep_alive, head)
        # uvicorn's protocol reads and sets only the attributes of its cycle that DirectCycle has.
        self.cycle = cycle  # type: ignore[assignment]
        scope["extensions"][RESPONSE_STATUS_EXTENSION] = {"response": cycle}
        return cycle

    def direct_route(self) -> ASGI3Application | None:
        """The route that serves the request whose head was just parsed in a `DirectCycle`, or None
        when uvicorn's cycle serves it: another path or method, a query string, HTTP/1.0,
        `Expect: 100-continue`, an upgrade, a chunked body, or pipelined behind an unfinished response."""
        route = self._direct_routes.get(self.url)
        if route is None or self.expect_100_continue:
            return None
        parser = self.parser
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1" or parser.should_upgrade():
            return None
        if self.cycle is not None and not self.cycle.response_complete:
            return None
        for name, _ in self.headers:
            if name == b"transfer-encoding":
                return None
        return route

    def connection_lost(self, exc: Exception | None) -> None:
        cycle, hook = self.cycle, self._loss_hook
        live = cycle is not None and not cycle.response_complete
        super().connection_lost(exc)
        if live and hook is not None:
            hook.lost()
