"""Notice a client that goes away while its request is still being served.

ASGI servers do not cancel a handler when its client disconnects; they only deliver an
`http.disconnect` message to the next `receive()`. `DisconnectWatch` waits on `receive()` in a side
task and cancels the handler's task when that message comes, so the upstream call (and its
connection) ends at once, before the first byte as well as mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from proxy.asgi_types import Receive


class DisconnectWatch:
    """Armed after the request body is read; disarmed before the last byte of the response.

    While armed, a disconnect cancels the task that armed it; that task then sees
    `asyncio.CancelledError` with `fired` True, and should call `absorb()` and return quietly.
    """

    __slots__ = ("_armed", "_receive", "_target", "_watcher", "fired")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._armed = False
        self._target: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.fired = False

    def arm(self) -> None:
        self._target = asyncio.current_task()
        self._armed = True
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    def disarm(self) -> None:
        """Stop watching; synchronous, so no cancellation can slip in after it."""
        self._armed = False
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
