"""One SERVER span per inference request on the gRPC front door, current while the pipeline runs.

Named and attributed per the OpenTelemetry RPC conventions (`inference.GRPCInferenceService/ModelInfer`,
`rpc.*`, `rpc.grpc.status_code`) with the GenAI request attributes; the parent is the caller's
`traceparent` metadata, so the engine's CLIENT span and the upstream call join the caller's trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from proxy.telemetry import propagation, semconv

SERVICE: Final = "inference.GRPCInferenceService"
OPERATION: Final = "text_completion"

_SERVER_ERRORS: Final = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
"""Codes that mark a SERVER span as failed (the RPC conventions; the others are the caller's)."""


class CallSpan:
    """The span of one request; `finish(code)` records how it ended."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set_stream(self, stream: bool) -> None:
        """Record whether the request streams (known once its tensors are read)."""
        if self._span.is_recording():
            self._span.set_attribute(semconv.GEN_AI_REQUEST_STREAM, stream)

    def finish(self, code: grpc.StatusCode, error_type: str | None = None) -> None:
        span = self._span
        if span.is_recording():
            span.set_attribute(semconv.RPC_GRPC_STATUS_CODE, code.value[0])
            if code is not grpc.StatusCode.OK:
                span.set_attribute(semconv.ERROR_TYPE, error_type or code.name)
                if code in _SERVER_ERRORS:
                    span.set_status(trace.StatusCode.ERROR)


@contextmanager
def call_span(
    tracer: trace.Tracer, method: str, metadata: Mapping[str, str], model: str
) -> Iterator[CallSpan]:
    """Start the span of one request (a child of the caller's trace context) and make it current."""
    traceparent = metadata.get(propagation.TRACEPARENT)
    parent = (
        propagation.extract(traceparent, metadata.get(propagation.TRACESTATE))
        if traceparent is not None
        else None
    )
    span = tracer.start_span(
        semconv.rpc_span_name(SERVICE, method),
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={
            semconv.RPC_SYSTEM: semconv.RPC_SYSTEM_GRPC,
            semconv.RPC_SERVICE: SERVICE,
            semconv.RPC_METHOD: method,
            semconv.GEN_AI_OPERATION_NAME: OPERATION,
            semconv.GEN_AI_REQUEST_MODEL: model,
        },
    )
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    try:
        yield CallSpan(span)
    except BaseException as exc:
        if span.is_recording():
            span.record_exception(exc)
        raise
    finally:
        otel_context.detach(token)
        span.end()
