"""uvicorn's httptools protocol with two guards on each request head: a time limit and a size limit.

Stock uvicorn waits for a request head as long as a client keeps the connection open, and buffers
as much of it as the client sends, so one client sending half a head (or a byte every few seconds)
holds a connection for good. The guards add what uvicorn has no setting for, and nothing else:
httptools still parses every byte and uvicorn still runs every request.

- A head not complete `server.header_timeout_s` after its first byte (or after the connection
  opened) is answered 408 and the connection closed.
- A head larger than `server.max_header_bytes` is answered 431 and the connection closed.

Both answers are OpenAI-shaped JSON errors. Only the asyncio protocol callbacks and httptools'
parser callbacks (`on_message_begin`, `on_headers_complete`) are extended, each calling uvicorn's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.errors import ErrorDetail, encode_error

DEFAULT_HEADER_TIMEOUT_S = 20.0
DEFAULT_MAX_HEADER_BYTES = 64 * 1024

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class HeadGuardProtocol(HttpToolsProtocol):
    """Pass `guarded_protocol(timeout, max_bytes)` as uvicorn's `http`."""

    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    max_header_bytes = DEFAULT_MAX_HEADER_BYTES
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0
    _in_head = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes:
                self._refuse(431, f"The request head is larger than {self.max_header_bytes} bytes.")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:
            self._start_head()

    def on_headers_complete(self) -> None:
        self._end_head()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        super().connection_lost(exc)

    def _start_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_due)

    def _end_head(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_due(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:  # an answer is still going out
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_due)
            return
        self._refuse(408, f"The request head did not arrive within {self.header_timeout_s:g} s.")

    def _refuse(self, status: int, message: str) -> None:
        self._end_head()
        code = "request_timeout" if status == 408 else "request_header_fields_too_large"
        body = encode_error(ErrorDetail(message=message, type="invalid_request_error", code=code))
        head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])
        fields = b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        fields += b"connection: close\r\n\r\n"
        self.transport.write(head + fields + body)
        self.transport.close()


def guarded_protocol(header_timeout_s: float, max_header_bytes: int) -> type[HeadGuardProtocol]:
    """The protocol class with these limits, for uvicorn's `http`."""
    attributes: dict[str, Any] = {"header_timeout_s": header_timeout_s, "max_header_bytes": max_header_bytes}
    return type("RadixgateHttpProtocol", (HeadGuardProtocol,), attributes)
