"""The request pipeline: one path from a generation request to its answer, for every front door.

    tenant = pipeline.authenticate(authorization)        # as soon as the credentials are in
    await pipeline.serve(GenerationCall(operation, body, tenant), responder)

The steps of `serve`, in order:

    decode      the body into the fields radixgate reads (msgspec); 400 naming the `param`; a cache
                salt the client sent is dropped from the body (the tenant's is the gateway's to set)
    admit       the tenant may use the model: it is served (404 `model_not_found`); the token cap
                (`[limits]`): a request without one gets the default, one above the bound a 400;
                the tenant's limits (`proxy.tenancy`): allowed models, rates, concurrency (429)
    cache       the exact-match response cache replays a hit, or records the miss (`proxy.cache.step`)
    lease       the forwarder leases a worker from the router and calls its engine adapter, retrying
                on another worker before the first byte (`proxy.forwarding`)
    relay       the answer goes to the front door's `Responder`: one JSON body, or a stream's chunks
    afterwards  the lease is released with the engine's usage (the routing tree learns what was
                cached); the tenant's token reservation is settled from it; a complete answer is
                stored; spans end and counters move

Authentication comes first and once, before the body is read, so a stranger's body is never read.
Errors before the answer starts are raised (`ApiError`, `EngineError`), and each front door answers
them through `proxy.errors.error_reply`; a stream that fails after its start ends with an error event.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass
from typing import Any

import msgspec

from adapters.base import Completion, EngineRequest, RouteHint
from adapters.cache_salt import without_client_salt
from adapters.errors import EngineError
from adapters.json_body import with_field
from adapters.schema import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    NativeResponsesRequest,
    Operation,
    RequestParams,
    Usage,
)
from proxy.auth import Tenant
from proxy.cache.step import CachedCall
from proxy.errors import ApiError, error_reply
from proxy.forwarding import UpstreamStream
from proxy.gateway import Gateway
from proxy.responder import REQUEST_ID_HEADER, Headers, Responder
from proxy.tenancy import BYTES_PER_TOKEN

logger = logging.getLogger("radixgate.pipeline")

MAX_CLIENT_REQUEST_ID = 128
"""Longest client-supplied request id that is kept; longer ones are replaced."""

# Not strict: JSON Schema (and OpenAI's own validation) take `2.0` for an integer, as msgspec then does.
_decoders: dict[Operation, msgspec.json.Decoder[Any]] = {
    "chat": msgspec.json.Decoder(ChatCompletionRequest, strict=False),
    "text_completion": msgspec.json.Decoder(CompletionRequest, strict=False),
    "embeddings": msgspec.json.Decoder(EmbeddingRequest, strict=False),
    "responses": msgspec.json.Decoder(NativeResponsesRequest, strict=False),
}


@dataclass(slots=True)
class GenerationCall:
    """One generation request as a front door hands it to the pipeline."""

    operation: Operation
    body: bytes
    """The request body, a JSON object of the OpenAI API; it travels on to upstreams as is."""
    tenant: Tenant
    """From `Pipeline.authenticate`."""
    client_request_id: bytes | None = None
    """The caller's request id (`x-request-id`), kept when it is short printable ASCII."""
    cache_control: bytes | None = None
    """The caller's `Cache-Control` directives (`no-store`, `no-cache`)."""
    cached: CachedCall | None = None
    """The `/v1/cached/*` options, and where the cache step reports what it did; None elsewhere."""
    route: RouteHint | None = None
    """A routing hint (`/v1/responses` continuations), and where the request was served."""


class Pipeline:
    """The steps every front door runs, over one gateway's parts."""

    __slots__ = ("_gateway",)

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def authenticate(self, authorization: bytes | None) -> Tenant:
        """The caller's tenant from its `Authorization` value; 401 when keys are required and it has none."""
        return self._gateway.auth.authenticate(authorization)

    async def serve(self, call: GenerationCall, responder: Responder) -> None:
        """Answer `call` through `responder`, or raise the error to answer before anything was sent."""
        gateway = self._gateway
        params, body = decode_body(call.operation, call.body)
        body = admit(gateway, call.tenant, params, body)
        tenant = call.tenant
        metrics = gateway.telemetry.gateway_metrics
        try:
            admission = await gateway.limiter.admit(tenant.id, params, len(body))
        except ApiError as refused:
            if refused.status == 429 and refused.detail.code is not None:
                metrics.tenant_refused.labels(tenant.id, refused.detail.code).inc()
            raise
        request = EngineRequest(
            call.operation,
            params,
            body,
            request_id(call.client_request_id),
            tenant.id,
            tenant.cache_salt,
            route=call.route,
            speculation=call.cached.speculation if call.cached is not None else None,
            sliding_window=call.cached.sliding_window if call.cached is not None else None,
        )
        headers: Headers = [(REQUEST_ID_HEADER, request.request_id.encode()), *admission.headers]
        spent = Spent()

        async def forward(sink: Responder) -> Completion | None:
            spent.forwarded = True
            if params.stream:
                stream = await gateway.forwarder.open_stream(request)
                await relay(sink, stream, headers)
                spent.answered, spent.usage = True, stream.usage
                return None
            completion = await gateway.forwarder.complete(request)
            await sink.send_json(completion.body, headers)
            spent.answered, spent.usage = True, completion.usage
            return completion

        gateway.active_requests += 1
        try:
            # The response cache answers a hit itself, or calls `forward` and stores a complete answer.
            await gateway.cache.respond(request, call.cached, call.cache_control, headers, responder, forward)
        finally:
            gateway.active_requests -= 1
            admission.settle(spent.tokens())
        prompt, completion_tokens, cached = spent.counts(len(body) // BYTES_PER_TOKEN, params)
        gateway.ledger.record(tenant.id, params.model, prompt, completion_tokens, cached)
        metrics.tenant_usage(tenant.id, prompt, completion_tokens, cached)


@dataclass(slots=True)
class Spent:
    """What one request cost the engine, for the tenant's limits and the usage ledger."""

    forwarded: bool = False
    """False for a response-cache hit, which costs no engine tokens."""
    answered: bool = False
    usage: Usage | None = None

    def tokens(self) -> int | None:
        """Tokens to settle a reservation with; None keeps it (answered, but no usage reported)."""
        if self.usage is not None:
            return self.usage.total_tokens
        return None if self.answered else 0

    def counts(self, prompt_estimate: int, params: RequestParams) -> tuple[int, int, int]:
        """(prompt, completion, cached) tokens for the ledger; estimated like the reservation when
        the engine reported no usage (a stream without `include_usage`), so none goes unbilled."""
        if not self.forwarded:
            return 0, 0, 0
        if self.usage is not None:
            return self.usage.prompt_tokens, self.usage.completion_tokens, self.usage.cached_tokens or 0
        return prompt_estimate, (params.token_limit or 0) * params.n, 0


def admit(gateway: Gateway, tenant: Tenant, params: RequestParams, body: bytes) -> bytes:
    """Refuse what this tenant may not ask for; the body to forward, with the default token cap set
    on a request that names none (`limits.default_max_tokens`)."""
    if not gateway.router.has_model(params.model):
        raise ApiError.model_not_found(params.model)
    limits = gateway.settings.limits
    asked = params.token_limit
    cap_field = "max_output_tokens" if isinstance(params, NativeResponsesRequest) else "max_tokens"
    if asked is None:
        if not limits.default_max_tokens or isinstance(params, EmbeddingRequest):
            return body
        if isinstance(params, NativeResponsesRequest):
            params.max_output_tokens = limits.default_max_tokens
        else:
            params.max_tokens = limits.default_max_tokens
        return with_field(body, cap_field, limits.default_max_tokens)
    if limits.max_tokens is not None and asked > limits.max_tokens:
        field = "max_completion_tokens" if getattr(params, "max_completion_tokens", None) else cap_field
        raise ApiError(
            400,
            f"Invalid request: {field} is {asked}, above this gateway's limit of {limits.max_tokens}.",
            param=field,
            code="invalid_value",
        )
    return body


async def relay(responder: Responder, stream: UpstreamStream, headers: Headers) -> None:
    """Send a whole engine stream, then close it; a failure midway ends the stream with an error event."""
    await responder.start_stream(headers, stream.first)
    try:
        async for chunk in stream:
            await responder.send_chunk(chunk)
    except Exception as exc:
        await stream.close(exc)
        if not isinstance(exc, EngineError):
            logger.error("stream failed after its first chunk", exc_info=exc)
        await responder.end_stream(error_reply(exc).detail)
        return
    except BaseException as exc:  # cancelled: the client went away
        await stream.close(exc)
        raise
    await stream.close()
    await responder.end_stream()


def decode_body(operation: Operation, body: bytes) -> tuple[RequestParams, bytes]:
    """The decoded fields, and the body to forward: without any cache salt the client sent (the
    tenant's salt is the gateway's to set, on every engine)."""
    params = decode_request(operation, body)
    if params.has_client_salt:
        body = without_client_salt(body)
        params.cache_salt = params.extra_key = msgspec.UNSET
    return params, body


def decode_request(operation: Operation, body: bytes) -> RequestParams:
    """The fields radixgate reads; 400 with `param` naming the offending field."""
    if not body:
        raise ApiError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    try:
        params: RequestParams = _decoders[operation].decode(body)
    except msgspec.ValidationError as exc:
        raise ApiError.invalid_body(exc) from None
    except msgspec.DecodeError as exc:
        raise ApiError.invalid_json(str(exc)) from None
    except RecursionError:
        raise ApiError.invalid_json("it is nested too deeply") from None
    if isinstance(params, EmbeddingRequest):
        check_embedding(params)
    return params


def check_embedding(params: EmbeddingRequest) -> None:
    """What the Struct cannot say: embeddings do not stream, and their input is not empty."""
    if params.stream:
        raise ApiError(
            400, "Invalid request: embeddings cannot be streamed.", param="stream", code="invalid_value"
        )
    if not params.input:
        raise ApiError(400, "Invalid request: `input` is empty.", param="input", code="invalid_value")


def request_id(client_value: bytes | None) -> str:
    """The caller's id when it is short printable ASCII, else a fresh one."""
    if client_value and len(client_value) <= MAX_CLIENT_REQUEST_ID and client_value.isascii():
        text = client_value.decode()
        if text.isprintable():
            return text
    return f"{_ID_PREFIX}{next(_id_counter):016x}"


_ID_PREFIX = os.urandom(8).hex()
"""Random per process, so ids stay unique across restarts and replicas; a counter makes the rest."""
_id_counter = itertools.count(1)
