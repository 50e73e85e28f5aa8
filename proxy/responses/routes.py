"""`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`.

A create request is translated to a chat completion (`proxy.responses.translate`) and served by the
one pipeline like any chat request: the same authentication, limits, response cache, routing and
retries; the answer goes out through `ResponsesResponder`. When every worker of the model serves
`/v1/responses` itself, the body is passed through instead (`proxy.responses.native`). A
`previous_response_id` continues a stored conversation of the caller's tenant (404 otherwise): a
translated one on the worker that served it while its load allows (where the KV of the whole history
lives), a passed-through one on that worker only (it keeps the conversation). Each stored response
keeps its input items (`proxy.responses.items`), listed a page at a time.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, delete, get
from litestar.handlers import ASGIRouteHandler, HTTPRouteHandler, asgi
from litestar.params import FromPath

from adapters.base import RouteHint
from adapters.engine_metrics import ServesResponses
from proxy.asgi_types import Receive, Scope, Send
from proxy.auth import Tenant, tenant_guard
from proxy.errors import JSON, ApiError
from proxy.gateway import Gateway
from proxy.pipeline import GenerationCall, Pipeline
from proxy.responses import items
from proxy.responses.native import NativeResponder
from proxy.responses.responder import ResponsesResponder
from proxy.responses.schema import ResponsesRequest
from proxy.responses.store import ResponseStore
from proxy.responses.translate import Message, chat_body, input_messages
from proxy.responses.turn import Turn, new_id
from proxy.routes.generation import ClientDisconnected, answer, read_request
from proxy.routes.options import options_handler

RESPONSES_PATH = "/v1/responses"
RESPONSE_PATH = "/v1/responses/{response_id:str}"
INPUT_ITEMS_PATH = "/v1/responses/{response_id:str}/input_items"

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
        stored = None
        context: list[items.Item] = []
        if request.previous_response_id is not None:
            stored = await store.run(store.get, http.tenant.id, request.previous_response_id)
            if stored is None:
                raise not_found(request.previous_response_id)
            history = _history_decoder.decode(stored.conversation)
            context = items.context_items(stored.input_items, stored.response)
            route.prefer_worker = stored.worker
        if stored.native if stored is not None else gateway.router.passes_responses_through(request.model):
            # The worker serves the Responses API and keeps the conversation: the body goes as sent.
            route.required = stored is not None
            call = GenerationCall(
                "responses", http.body, http.tenant, http.request_id, http.cache_control, route=route
            )
            kept = store if request.store else None
            listed = items.encode([*context, *items.request_items(request.input, new_id)])
            await answer(
                pipeline,
                call,
                receive,
                send,
                responder_for=lambda send, disarm: NativeResponder(
                    send, disarm, http.tenant.id, kept, route, listed
                ),
            )
            return
        messages = input_messages(request.input)
        listed_items = [*context, *items.request_items(request.input, new_id)]
        turn = Turn(request, http.tenant.id, history, messages, route, listed_items)
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
        stored = await store.run(store.get, tenant.id, response_id)
        if stored is None:
            raise not_found(response_id)
        return Response(stored.response, media_type=JSON)

    @delete(RESPONSE_PATH, guards=guards, name="delete_response", status_code=200)
    async def delete_response(request: Request[Any, Any, Any], response_id: FromPath[str]) -> Response[bytes]:
        tenant: Tenant = request.state.tenant
        stored = await store.run(store.get, tenant.id, response_id)
        if stored is None or not await store.run(store.delete, tenant.id, response_id):
            raise not_found(response_id)
        worker = gateway.router.worker(stored.worker) if stored.native and stored.worker else None
        if worker is not None and isinstance(worker.engine, ServesResponses):
            await worker.engine.delete_response(response_id)  # the worker's own copy, too
        deleted = {"id": response_id, "object": "response", "deleted": True}
        return Response(_encoder.encode(deleted), media_type=JSON)

    @get(INPUT_ITEMS_PATH, guards=guards, name="list_input_items")
    async def list_input_items(
        request: Request[Any, Any, Any], response_id: FromPath[str]
    ) -> Response[bytes]:
        tenant: Tenant = request.state.tenant
        query = items.page_query(request.query_params.multi_items())
        stored = await store.run(store.get, tenant.id, response_id)
        if stored is None:
            raise not_found(response_id)
        listing = items.page(items.stored_items(stored.input_items), query)
        return Response(_encoder.encode(listing), media_type=JSON)

    # The explicit OPTIONS goes first: Litestar 2 adds its own for the first handler of a path otherwise.
    return [
        options_handler(RESPONSE_PATH, ("GET", "DELETE")),
        options_handler(INPUT_ITEMS_PATH, ("GET",)),
        create_response,
        get_response,
        delete_response,
        list_input_items,
    ]
