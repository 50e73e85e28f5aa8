"""Plain ASGI types for the handlers that speak ASGI directly (the generation routes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


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
