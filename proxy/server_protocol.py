"""uvicorn's httptools protocol, writing each response's head together with its first body bytes.

uvicorn writes the status line and headers the moment an app sends `http.response.start`, and
uvloop sends every write at once: a JSON answer left as two syscalls and two TCP segments (and
woke the client twice). `HeadWithBodyTransport` holds a response head back until the next write,
or until the loop's next turn when no body follows at once, so a head and the body sent right
after it leave in one write. Measured in `benchmarks/RESULTS.md` "## overhead".
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from uvicorn._types import ASGI3Application
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.asgi_types import RESPONSE_STATUS_EXTENSION
from proxy.direct_cycle import DefaultHead, DirectCycle
from proxy.disconnect import DISCONNECT_EXTENSION, ConnectionLossHook

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

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = HeadWithBodyTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]

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
        self.cycle = cycle = DirectCycle(
            scope,
            self.transport,
            self.flow,
            keep_alive=self.parser.should_keep_alive(),
            default_head=self._default_head.lines(self.server_state.default_headers),
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            on_response=self.on_response_complete,
        )
        scope["extensions"][RESPONSE_STATUS_EXTENSION] = {"response": cycle}
        self._start_asgi_task(cycle, route)

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
