"""The few ASGI primitives the simulated engine's HTTP server needs (plain ASGI: cheap per request),
and the request bodies it reads."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec

from adapters.schema import StreamOptions

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_body(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type.encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, payload: object) -> None:
    await send_body(send, status, msgspec.json.encode(payload), "application/json")


async def start_sse(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
        }
    )


async def sse(send: Send, payload: bytes, *, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": b"data: " + payload + b"\n\n", "more_body": more})


class GenerateBody(msgspec.Struct, kw_only=True):
    """SGLang's native `/generate` request (the fields the simulator reads)."""

    text: str | list[str] | None = None
    input_ids: list[Any] | None = None
    sampling_params: dict[str, Any] = msgspec.field(default_factory=dict)
    stream: bool = False
    rid: str | None = None
    extra_key: str | None = None


class CompletionBody(msgspec.Struct, kw_only=True):
    """OpenAI `/v1/completions` (the fields the simulator reads)."""

    prompt: str | list[Any]
    max_tokens: int | None = None
    cache_salt: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
