"""`POST /v1/chat/completions`, `/v1/completions` and `/v1/embeddings`: the HTTP front door of the pipeline.

They are Litestar ASGI handlers rather than decoded-data handlers: the body is read once (with a
size limit) and handed as bytes to `proxy.pipeline`, which decodes it once and forwards the raw
bytes. A disconnect watch cancels the request when its client goes away. Errors raised before the
answer starts are turned into OpenAI-shaped responses by the app's exception handlers (`proxy.errors`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NamedTuple

from litestar.handlers import ASGIRouteHandler, asgi

from adapters.schema import Operation
from proxy.asgi_types import Receive, Scope, Send
from proxy.auth import Tenant
from proxy.disconnect import DisconnectWatch
from proxy.errors import ApiError
from proxy.pipeline import GenerationCall, Pipeline
from proxy.responder import REQUEST_ID_HEADER, Responder
from proxy.routes.asgi_responder import AsgiResponder

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"


class ClientDisconnected(Exception):
    """The client went away before its request body was complete."""


class HttpRequest(NamedTuple):
    """What the generation routes read of an HTTP request before the pipeline runs."""

    tenant: Tenant
    body: bytes
    request_id: bytes | None
    cache_control: bytes | None


def generation_handlers(pipeline: Pipeline, max_body_bytes: int) -> list[ASGIRouteHandler]:
    """The two generation routes over one pipeline."""

    async def handle(operation: Operation, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            request = await read_request(pipeline, scope, receive, max_body_bytes)
        except ClientDisconnected:
            return
        call = GenerationCall(
            operation, request.body, request.tenant, request.request_id, request.cache_control
        )
        await answer(pipeline, call, receive, send)

    @asgi(CHAT_PATH, name="chat_completions", copy_scope=False)
    async def chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
        await handle("chat", scope, receive, send)

    @asgi(COMPLETIONS_PATH, name="completions", copy_scope=False)
    async def completions(scope: Scope, receive: Receive, send: Send) -> None:
        await handle("text_completion", scope, receive, send)

    @asgi(EMBEDDINGS_PATH, name="embeddings", copy_scope=False)
    async def embeddings(scope: Scope, receive: Receive, send: Send) -> None:
        await handle("embeddings", scope, receive, send)

    return [chat_completions, completions, embeddings]


async def read_request(pipeline: Pipeline, scope: Scope, receive: Receive, limit: int) -> HttpRequest:
    """Authenticate from the headers, then read the body (a stranger's body is never read)."""
    if scope["method"] != "POST":
        raise ApiError.method_not_allowed(scope["method"], scope["path"], "POST")
    authorization = content_length = client_request_id = None
    cache_control: list[bytes] = []
    for name, value in scope["headers"]:
        if name == b"authorization":
            if authorization is not None:
                raise ApiError.duplicate_header("Authorization")
            authorization = value
        elif name == b"content-length":
            content_length = value
        elif name == REQUEST_ID_HEADER:
            client_request_id = value
        elif name == b"cache-control":
            cache_control.append(value)
    tenant = pipeline.authenticate(authorization)
    body = await read_body(receive, content_length, limit)
    return HttpRequest(tenant, body, client_request_id, b",".join(cache_control) if cache_control else None)


async def answer(
    pipeline: Pipeline,
    call: GenerationCall,
    receive: Receive,
    send: Send,
    wrap: Callable[[Responder], Responder] | None = None,
    responder_for: Callable[[Send, Callable[[], None]], Responder] = AsgiResponder,
) -> None:
    """Run `call` through the pipeline with a disconnect watch; `wrap` decorates the responder, which
    `responder_for(send, before_last)` makes (the chat wire's by default)."""
    watch = DisconnectWatch(receive)
    responder: Responder = responder_for(send, watch.disarm)
    if wrap is not None:
        responder = wrap(responder)
    watch.arm()
    try:
        await pipeline.serve(call, responder)
    except asyncio.CancelledError:
        if not watch.fired:
            raise
        watch.absorb()  # the client is gone: nothing left to answer
    finally:
        watch.disarm()


async def read_body(receive: Receive, content_length: bytes | None, limit: int) -> bytes:
    """The whole request body; 413 as soon as it is known to exceed `limit`."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise ApiError(400, "The Content-Length header is not a number.", code="invalid_header") from None
        if declared > limit:
            raise ApiError.body_too_large(limit)
    parts: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        part: bytes = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise ApiError.body_too_large(limit)
        parts.append(part)
        more = message.get("more_body", False)
    return parts[0] if len(parts) == 1 else b"".join(parts)
