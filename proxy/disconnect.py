"""Notice a client that goes away while its request is still being served.

ASGI servers do not cancel a handler when its client disconnects; they only deliver an
`http.disconnect` message to the next `receive()`. `DisconnectWatch` cancels the handler's task
when that happens, so the upstream call (and its connection) ends at once, before the first byte
as well as mid-stream. Under `radixgate serve` the server itself reports the lost connection through
a `ConnectionLossHook` in the request's scope (`proxy.server_protocol`), which costs an attribute
write per request; under any other ASGI server a side task waits on `receive()` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from proxy.asgi_types import Receive, Scope

DISCONNECT_EXTENSION = "radixgate.connection_loss"
"""Key of the extension in a request scope's `extensions`; its `"hook"` is a `ConnectionLossHook`."""


class ConnectionLossHook:
    """Put in a request's scope by the server; `lost()` runs `callback` (when set) if the client's
    connection closes before the response is complete."""

    __slots__ = ("callback",)

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None

    def lost(self) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


class DisconnectWatch:
    """Armed after the request body is read; disarmed before the last byte of the response.

    While armed, a disconnect cancels the task that armed it; that task then sees
    `asyncio.CancelledError` with `fired` True, and should call `absorb()` and return quietly.
    """

    __slots__ = ("_armed", "_hook", "_receive", "_target", "_watcher", "fired")

    def __init__(self, receive: Receive, scope: Scope | None = None) -> None:
        self._receive = receive
        extensions = (scope.get("extensions") if scope is not None else None) or {}
        self._hook: ConnectionLossHook | None = extensions.get(DISCONNECT_EXTENSION, {}).get("hook")
        self._armed = False
        self._target: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.fired = False

    def arm(self) -> None:
        self._target = asyncio.current_task()
        self._armed = True
        if self._hook is not None:
            self._hook.callback = self._fire
        else:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    def disarm(self) -> None:
        """Stop watching; synchronous, so no cancellation can slip in after it."""
        self._armed = False
        if self._hook is not None:
            self._hook.callback = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def absorb(self) -> None:
        """Undo the cancellation this watch caused, so the handler can finish normally."""
        if self._target is not None:
            self._target.uncancel()

    async def _watch(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            while (await self._receive())["type"] != "http.disconnect":
                pass
        self._fire()

    def _fire(self) -> None:
        if self._armed and self._target is not None:
            self.fired = True
            self._target.cancel()
