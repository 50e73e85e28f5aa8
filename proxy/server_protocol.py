"""uvicorn's httptools protocol, writing each response's head together with its first body bytes.

uvicorn writes the status line and headers the moment an app sends `http.response.start`, and
uvloop sends every write at once: a JSON answer left as two syscalls and two TCP segments (and
woke the client twice). `HeadWithBodyTransport` holds a response head back until the next write,
or until the loop's next turn when no body follows at once, so a head and the body sent right
after it leave in one write. Measured in `benchmarks/RESULTS.md` "## overhead".
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatewayHttpProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` over a `HeadWithBodyTransport` (pass the class as uvicorn's `http`).

    Each request's scope also carries a `ConnectionLossHook` (`extensions`), fired when the
    connection closes before that request's response is complete: `DisconnectWatch` then needs no
    task of its own per request.
    """

    _loss_hook: ConnectionLossHook | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = HeadWithBodyTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        hook = self._loss_hook = ConnectionLossHook()
        self.scope["extensions"] = {DISCONNECT_EXTENSION: {"hook": hook}}  # ASGI: an extension is a dict

    def connection_lost(self, exc: Exception | None) -> None:
        cycle, hook = self.cycle, self._loss_hook
        live = cycle is not None and not cycle.response_complete
        super().connection_lost(exc)
        if live and hook is not None:
            hook.lost()
