"""Server-Sent Events exactly as OpenAI frames them: `data: {json}\\n\\n` per chunk, then
`data: [DONE]\\n\\n`. Headers go out only once the first chunk has arrived (errors before it
are HTTP errors); an error after it becomes one `data: {"error": ...}` event, then `[DONE]`,
and the response ends cleanly, which the openai SDK raises as `APIError`.
"""

from __future__ import annotations

from collections.abc import Callable

from adapters.errors import EngineError
from proxy.asgi_types import Send
from proxy.errors import encode_error, engine_error_detail
from proxy.forwarding import UpstreamStream

SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies such as nginx must not buffer the stream
)
DONE_EVENT = b"data: [DONE]\n\n"


def sse_event(payload: bytes) -> bytes:
    return b"".join((b"data: ", payload, b"\n\n"))


def error_event(error: EngineError) -> bytes:
    return sse_event(encode_error(engine_error_detail(error)))


async def relay(
    send: Send, stream: UpstreamStream, headers: list[tuple[bytes, bytes]], before_last: Callable[[], None]
) -> None:
    """Send the whole stream; `before_last` runs just before the final body message."""
    await send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]})
    await send({"type": "http.response.body", "body": sse_event(stream.first), "more_body": True})
    try:
        async for chunk in stream:
            await send({"type": "http.response.body", "body": sse_event(chunk), "more_body": True})
    except EngineError as exc:
        await stream.close(exc)
        before_last()
        await send({"type": "http.response.body", "body": error_event(exc) + DONE_EVENT, "more_body": False})
        return
    except BaseException as exc:
        await stream.close(exc)
        raise
    await stream.close()
    before_last()
    await send({"type": "http.response.body", "body": DONE_EVENT, "more_body": False})
