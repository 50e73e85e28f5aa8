"""Plain ASGI types for the handlers that speak ASGI directly (the generation routes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

RESPONSE_STATUS_EXTENSION = "radixgate.response_status"
"""Key of an extension in a request scope's `extensions` that a server may set (`proxy.direct_cycle`):
its `"response"` is a `ResponseStatus` of this request's response. Middleware that needs the status
reads it there instead of wrapping `send` (a coroutine frame per message, on the hot path)."""


class ResponseStatus(Protocol):
    """The status of a response, as sent: 0 until `http.response.start` has been sent."""

    @property
    def status(self) -> int: ...


def tracking_status(scope: Scope, send: Send) -> tuple[ResponseStatus, Send]:
    """The status of this request's response, and the `send` that keeps it: the server's
    `ResponseStatus` and `send` itself when the server gives one, else a `StatusSend` around `send`."""
    extensions = scope.get("extensions")
    extension = extensions.get(RESPONSE_STATUS_EXTENSION) if extensions else None
    if extension:
        return extension["response"], send
    wrapper = StatusSend(send)
    return wrapper, wrapper.send


class StatusSend:
    """Passes ASGI messages on and keeps the response's status (0 until one is sent)."""

    __slots__ = ("_send", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 0

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)
