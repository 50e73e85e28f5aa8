"""`POST /v1/chat/completions` and `POST /v1/completions`, the gateway's hot path.

They are plain ASGI handlers rather than Litestar's decoded-data handlers: the body is read
once (with a size limit), decoded once by a msgspec Decoder built at import, and the raw
bytes travel on to the upstream. Response bytes are relayed as they come. Errors are raised
as `ApiError`/`EngineError` and turned into OpenAI-shaped responses by `proxy.errors`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import msgspec
from litestar.handlers import ASGIRouteHandler, asgi

from adapters.base import Completion, EngineRequest
from adapters.schema import ChatCompletionRequest, CompletionRequest, GenerationRequest, Operation
from proxy.asgi_types import Receive, Scope, Send
from proxy.disconnect import DisconnectWatch
from proxy.errors import JSON, ApiError
from proxy.gateway import Gateway
from proxy.streaming import relay

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
REQUEST_ID_HEADER = b"x-request-id"
MAX_CLIENT_REQUEST_ID = 128
"""Longest client-supplied `x-request-id` that is kept; longer ones are replaced."""

_decoders: dict[Operation, msgspec.json.Decoder[Any]] = {
    "chat": msgspec.json.Decoder(ChatCompletionRequest),
    "text_completion": msgspec.json.Decoder(CompletionRequest),
}


class ClientDisconnected(Exception):
    """The client went away before its request body was complete."""


def generation_handlers(gateway: Gateway) -> list[ASGIRouteHandler]:
    """The two generation routes, bound to one gateway."""

    @asgi(CHAT_PATH, name="chat_completions", copy_scope=False)
    async def chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
        await handle_generation(gateway, "chat", scope, receive, send)

    @asgi(COMPLETIONS_PATH, name="completions", copy_scope=False)
    async def completions(scope: Scope, receive: Receive, send: Send) -> None:
        await handle_generation(gateway, "text_completion", scope, receive, send)

    return [chat_completions, completions]


async def handle_generation(
    gateway: Gateway, operation: Operation, scope: Scope, receive: Receive, send: Send
) -> None:
    """Read, check and forward one generation request, then answer with JSON or SSE."""
    if scope["method"] != "POST":
        raise ApiError.method_not_allowed(scope["method"], scope["path"], "POST")
    authorization = content_length = client_request_id = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value
        elif name == b"content-length":
            content_length = value
        elif name == REQUEST_ID_HEADER:
            client_request_id = value
    tenant = gateway.auth.authenticate(authorization)
    try:
        body = await read_body(receive, content_length, gateway.settings.server.max_body_bytes)
    except ClientDisconnected:
        return
    params = decode_request(operation, body)
    if not gateway.router.has_model(params.model):
        raise ApiError.model_not_found(params.model)
    request_id = _request_id(client_request_id)
    request = EngineRequest(operation, params, body, request_id, tenant.id, tenant.cache_salt)
    headers = [(REQUEST_ID_HEADER, request_id.encode())]

    watch = DisconnectWatch(receive, scope)

    async def forward(send: Send) -> Completion | None:
        if params.stream:
            stream = await gateway.forwarder.open_stream(request)
            await relay(send, stream, headers, watch.disarm)
            return None
        completion = await gateway.forwarder.complete(request)
        watch.disarm()
        headers.append((b"content-type", JSON.encode()))
        headers.append((b"content-length", str(len(completion.body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": completion.body})
        return completion

    gateway.active_requests += 1
    watch.arm()
    try:
        # The response cache answers a hit itself, or calls `forward` and stores a complete answer.
        await gateway.cache.respond(request, scope["headers"], headers, send, forward)
    except asyncio.CancelledError:
        if not watch.fired:
            raise
        watch.absorb()  # the client is gone: nothing left to answer
    finally:
        watch.disarm()
        gateway.active_requests -= 1


async def read_body(receive: Receive, content_length: bytes | None, limit: int) -> bytes:
    """The whole request body; 413 as soon as it is known to exceed `limit`."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise ApiError(400, "The Content-Length header is not a number.", code="invalid_header") from None
        if declared > limit:
            raise ApiError.body_too_large(limit)
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientDisconnected
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise ApiError.body_too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        part: bytes = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise ApiError.body_too_large(limit)
        parts.append(part)
    return b"".join(parts)


def decode_request(operation: Operation, body: bytes) -> GenerationRequest:
    """The fields radixgate reads; 400 with `param` naming the offending field."""
    if not body:
        raise ApiError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    try:
        params: GenerationRequest = _decoders[operation].decode(body)
    except msgspec.ValidationError as exc:
        raise ApiError.invalid_body(exc) from None
    except msgspec.DecodeError as exc:
        raise ApiError.invalid_json(str(exc)) from None
    return params


def _request_id(client_value: bytes | None) -> str:
    if client_value and len(client_value) <= MAX_CLIENT_REQUEST_ID and client_value.isascii():
        text = client_value.decode()
        if text.isprintable():
            return text
    return f"{_ID_PREFIX}{next(_id_counter):016x}"


_ID_PREFIX = os.urandom(8).hex()
"""Random per process, so ids stay unique across restarts and replicas; a counter makes the rest
(one `getrandom` syscall per request was measurable at ~2,000 requests/s on one core)."""
_id_counter = itertools.count(1)
