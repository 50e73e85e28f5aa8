"""The HTTP front door's `Responder`: JSON responses and Server-Sent Events over ASGI `send`.

SSE exactly as OpenAI frames them: `data: {json}\\n\\n` per chunk, then `data: [DONE]\\n\\n`. Headers go
out only with the first chunk (errors before it are HTTP errors); an error after it becomes one
`data: {"error": ...}` event, then `[DONE]`, and the response ends cleanly, which the openai SDK raises
as `APIError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxy.asgi_types import Send
from proxy.errors import JSON, ErrorDetail, encode_error
from proxy.responder import Headers

SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies such as nginx must not buffer the stream
)
DONE_EVENT = b"data: [DONE]\n\n"
_JSON_TYPE = JSON.encode()


def sse_event(payload: bytes) -> bytes:
    return b"".join((b"data: ", payload, b"\n\n"))


def error_event(error: ErrorDetail) -> bytes:
    return sse_event(encode_error(error))


class AsgiResponder:
    """Writes one answer through ASGI `send`; `before_last` runs just before the final body message
    (the disconnect watch is disarmed there, so a client leaving after it cancels nothing)."""

    __slots__ = ("_before_last", "_send", "started")

    def __init__(self, send: Send, before_last: Callable[[], None]) -> None:
        self._send = send
        self._before_last = before_last
        self.started = False
        """True once the response head has been sent: an error can no longer be an HTTP status."""

    async def send_json(self, body: bytes, headers: Headers) -> None:
        self._before_last()
        self.started = True
        head = [*headers, (b"content-type", _JSON_TYPE), (b"content-length", str(len(body)).encode())]
        await self._send({"type": "http.response.start", "status": 200, "headers": head})
        await self._send({"type": "http.response.body", "body": body})

    async def start_stream(self, headers: Headers, first: bytes) -> None:
        self.started = True
        await self._send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]})
        await self._send({"type": "http.response.body", "body": sse_event(first), "more_body": True})

    async def send_chunk(self, payload: bytes) -> None:
        await self._send({"type": "http.response.body", "body": sse_event(payload), "more_body": True})

    async def end_stream(self, error: ErrorDetail | None = None) -> None:
        self._before_last()
        body = DONE_EVENT if error is None else error_event(error) + DONE_EVENT
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def send_stream(self, headers: Headers, chunks: Sequence[bytes]) -> None:
        self._before_last()
        self.started = True
        body = b"".join([*(sse_event(chunk) for chunk in chunks), DONE_EVENT])
        await self._send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})
