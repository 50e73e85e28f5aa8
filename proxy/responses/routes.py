"""`POST /v1/responses`, `GET /v1/responses/{id}` and `DELETE /v1/responses/{id}`.

A create request is translated to a chat completion (`proxy.responses.translate`) and served by the
one pipeline like any chat request: the same authentication, limits, response cache, routing and
retries. A `previous_response_id` continues a stored conversation of the caller's tenant (404
otherwise) and asks the router for the worker that served it, where the KV of the whole history
lives. The answer goes out through `ResponsesResponder`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Request, Response, delete, get
from litestar.handlers import ASGIRouteHandler, HTTPRouteHandler, asgi
from litestar.params import FromPath

from adapters.base import RouteHint
from proxy.asgi_types import Receive, Scope, Send
from proxy.auth import Tenant, tenant_guard
from proxy.errors import JSON, ApiError
from proxy.gateway import Gateway
from proxy.pipeline import GenerationCall, Pipeline
from proxy.responses.responder import ResponsesResponder
from proxy.responses.schema import ResponsesRequest
from proxy.responses.store import ResponseStore
from proxy.responses.translate import Message, chat_body, input_messages
from proxy.responses.turn import Turn
from proxy.routes.generation import ClientDisconnected, answer, read_request
from proxy.routes.options import options_handler

RESPONSES_PATH = "/v1/responses"
RESPONSE_PATH = "/v1/responses/{response_id:str}"

_decoder = msgspec.json.Decoder(ResponsesRequest, strict=False)
_history_decoder = msgspec.json.Decoder(list[dict[str, Any]])
_encoder = msgspec.json.Encoder()


def not_found(response_id: str) -> ApiError:
    """An unknown id, an expired one and another tenant's are one answer: nothing tells them apart."""
    return ApiError(
        404, f"No response with id `{response_id}` was found.", param="response_id", code="response_not_found"
    )


def decode_responses_request(body: bytes) -> ResponsesRequest:
    if not body:
        raise ApiError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    try:
        return _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise ApiError.invalid_body(exc) from None
    except msgspec.DecodeError as exc:
        raise ApiError.invalid_json(str(exc)) from None
    except RecursionError:
        raise ApiError.invalid_json("it is nested too deeply") from None


def responses_handlers(
    gateway: Gateway, pipeline: Pipeline, store: ResponseStore, max_body_bytes: int
) -> list[ASGIRouteHandler | HTTPRouteHandler]:
    """The three Responses routes over one pipeline and one store."""

    @asgi(RESPONSES_PATH, name="create_response", copy_scope=False)
    async def create_response(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            http = await read_request(pipeline, scope, receive, max_body_bytes)
        except ClientDisconnected:
            return
        request = decode_responses_request(http.body)
        history: list[Message] = []
        route = RouteHint()
        if request.previous_response_id is not None:
            stored = await asyncio.to_thread(store.get, http.tenant.id, request.previous_response_id)
            if stored is None:
                raise not_found(request.previous_response_id)
            history = _history_decoder.decode(stored.conversation)
            route.prefer_worker = stored.worker
        turn = Turn(request, http.tenant.id, history, input_messages(request.input), route)
        body = _encoder.encode(chat_body(request, history, turn.messages))
        call = GenerationCall("chat", body, http.tenant, http.request_id, http.cache_control, route=route)
        await answer(
            pipeline,
            call,
            receive,
            send,
            responder_for=lambda send, disarm: ResponsesResponder(send, disarm, turn, store),
        )

    guards = [tenant_guard(gateway.auth)]

    @get(RESPONSE_PATH, guards=guards, name="get_response")
    async def get_response(request: Request[Any, Any, Any], response_id: FromPath[str]) -> Response[bytes]:
        tenant: Tenant = request.state.tenant  # set by the guard
        stored = await asyncio.to_thread(store.get, tenant.id, response_id)
        if stored is None:
            raise not_found(response_id)
        return Response(stored.response, media_type=JSON)

    @delete(RESPONSE_PATH, guards=guards, name="delete_response", status_code=200)
    async def delete_response(request: Request[Any, Any, Any], response_id: FromPath[str]) -> Response[bytes]:
        tenant: Tenant = request.state.tenant
        if not await asyncio.to_thread(store.delete, tenant.id, response_id):
            raise not_found(response_id)
        deleted = {"id": response_id, "object": "response", "deleted": True}
        return Response(_encoder.encode(deleted), media_type=JSON)

    # The explicit OPTIONS goes first: Litestar 2 adds its own for the first handler of a path otherwise.
    return [options_handler(RESPONSE_PATH, ("GET", "DELETE")), create_response, get_response, delete_response]
