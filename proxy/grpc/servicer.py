"""The RPCs of `inference.GRPCInferenceService`, each inference request run by `Pipeline.serve`.

A request's tensors become an OpenAI completions body (`proxy.grpc.tensors`) and a `GenerationCall`
whose tenant comes from the `authorization` metadata; decoding, admission, the response cache,
routing and usage are the pipeline's, as for HTTP. Errors the pipeline raises become the gRPC status
of their HTTP status (`proxy.grpc.status`); on a stream a failed request is answered in-band with
`error_message`, as Triton does, and only a failed authentication ends the whole stream. A caller that
cancels cancels the handler's task, which cancels the pipeline and so the upstream request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

import grpc
from opentelemetry import trace

from proxy.auth import Tenant
from proxy.errors import ApiError
from proxy.gateway import Gateway
from proxy.grpc.protocol import grpc_service_pb2 as pb
from proxy.grpc.responder import StreamResponder, UnaryResponder, Write
from proxy.grpc.status import GrpcError, grpc_error
from proxy.grpc.tensors import INPUT_DATATYPES, TEXT_OUTPUT, TextRequest, read_text_request
from proxy.grpc.tracing import CallSpan, call_span
from proxy.pipeline import GenerationCall, Pipeline
from proxy.responder import Headers

logger = logging.getLogger("radixgate.grpc")

SERVER_NAME: Final = "radixgate"
PLATFORM: Final = "radixgate"
"""ModelMetadata's `platform` of every model: served through the gateway's pipeline."""
CACHE_CONTROL: Final = "cache-control"

Metadata = dict[str, str]


class InferenceServicer:
    """The service's handlers over one gateway and its pipeline (`grpc.aio` calls them on its loop)."""

    def __init__(self, gateway: Gateway, pipeline: Pipeline) -> None:
        self._gateway = gateway
        self._pipeline = pipeline
        self._tracer: trace.Tracer = gateway.telemetry.tracer

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        readiness = self._gateway.router.readiness()
        return pb.ServerReadyResponse(ready=bool(readiness) and all(readiness.values()))

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._gateway.router.readiness().get(request.name, False))

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=self._gateway.version)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        if not self._gateway.router.has_model(request.name):
            error = grpc_error(ApiError.model_not_found(request.name))
            await context.abort(error.code, error.message)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=request.name,
            platform=PLATFORM,
            inputs=[tensor(name=name, datatype=kind, shape=[1]) for name, kind in INPUT_DATATYPES.items()],
            outputs=[tensor(name=TEXT_OUTPUT, datatype="BYTES", shape=[-1])],
        )

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        metadata = _metadata(context)
        error: GrpcError | None = None
        with call_span(self._tracer, "ModelInfer", metadata, request.model_name) as span:
            try:
                response, headers = await self._infer(request, metadata, span)
            except Exception as exc:
                error = grpc_error(exc)
                span.finish(error.code, str(error.http_status))
            else:
                span.finish(grpc.StatusCode.OK)
        if error is not None:
            await context.abort(error.code, error.message)  # raises
        # Trailing: it goes out with the status, where initial metadata would be a write of its own.
        context.set_trailing_metadata([(name.decode(), value.decode()) for name, value in headers])
        return response

    async def _infer(
        self, request: pb.ModelInferRequest, metadata: Metadata, span: CallSpan
    ) -> tuple[pb.ModelInferResponse, Headers]:
        """One ModelInfer request through the pipeline: its response and the answer's metadata."""
        tenant = self._pipeline.authenticate(_authorization(metadata))
        text_request = _read(request)
        span.set_stream(text_request.stream)
        if text_request.stream:
            raise ApiError(400, "ModelInfer answers once; send `stream` true to ModelStreamInfer.")
        responder = UnaryResponder(request, _prefix(text_request))
        await self._pipeline.serve(_call(request, text_request, tenant, metadata), responder)
        if responder.response is None:
            raise RuntimeError("the pipeline ended without an answer")
        return responder.response, responder.headers

    async def ModelStreamInfer(self, requests: AsyncIterator[pb.ModelInferRequest], context: Any) -> None:
        metadata = _metadata(context)
        try:
            tenant = self._pipeline.authenticate(_authorization(metadata))
        except ApiError as exc:
            error = grpc_error(exc)
            await context.abort(error.code, error.message)
        lock = asyncio.Lock()

        async def write(response: pb.ModelStreamInferResponse) -> None:
            async with lock:  # requests on one stream are served at once; their writes take turns
                await context.write(response)

        tasks: set[asyncio.Task[None]] = set()
        try:
            async for request in requests:
                task = asyncio.create_task(self._serve_on_stream(request, tenant, metadata, write))
                tasks.add(task)
                task.add_done_callback(functools.partial(_finished, tasks))
            while tasks:  # the caller has sent all its requests: answer them before the call ends
                await asyncio.wait(set(tasks))
        finally:
            for task in tasks:  # the caller cancelled: so is every request it has in flight
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve_on_stream(
        self,
        request: pb.ModelInferRequest,
        tenant: Tenant,
        metadata: Metadata,
        write: Write,
    ) -> None:
        with call_span(self._tracer, "ModelStreamInfer", metadata, request.model_name) as span:
            try:
                text_request = _read(request)
                span.set_stream(text_request.stream)
                responder = StreamResponder(request, _prefix(text_request), write)
                await self._pipeline.serve(_call(request, text_request, tenant, metadata), responder)
            except Exception as exc:
                error = grpc_error(exc)
                span.finish(error.code, str(error.http_status))
                reply = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
                await write(pb.ModelStreamInferResponse(error_message=error.message, infer_response=reply))
            else:
                span.finish(grpc.StatusCode.OK)


def _finished(tasks: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    """A request on a stream is done; a failure to answer it (the call already ended) is logged."""
    tasks.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.warning("a request on a ModelStreamInfer call could not be answered: %r", error)


def _read(request: pb.ModelInferRequest) -> TextRequest:
    if request.model_version:
        raise ApiError(
            404,
            f"The model `{request.model_name}` has no versions; leave `model_version` empty.",
            param="model_version",
            code="model_not_found",
        )
    return read_text_request(request)


def _call(
    request: pb.ModelInferRequest, text_request: TextRequest, tenant: Tenant, metadata: Metadata
) -> GenerationCall:
    cache_control = metadata.get(CACHE_CONTROL)
    return GenerationCall(
        "text_completion",
        text_request.completions_body(request.model_name),
        tenant,
        client_request_id=request.id.encode() or None,
        cache_control=cache_control.encode() if cache_control is not None else None,
    )


def _prefix(text_request: TextRequest) -> str:
    """The prompt when the caller wants it in front of the text (`exclude_input_in_output` false)."""
    return "" if text_request.exclude_input else text_request.text


def _metadata(context: Any) -> Metadata:
    """The call's text metadata (binary `-bin` entries are not read)."""
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


def _authorization(metadata: Metadata) -> bytes | None:
    value = metadata.get("authorization")
    return value.encode("latin-1") if value is not None else None
