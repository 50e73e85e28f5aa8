"""OTLP over gRPC: `OTEL_EXPORTER_OTLP_PROTOCOL=grpc` sends spans to a real gRPC collector service."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

from proxy.telemetry.providers import build_span_processor


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.span_names: list[str] = []
        self.received = threading.Event()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.span_names.extend(span.name for span in scope_spans.spans)
        self.received.set()
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[_Collector, str]]:
    servicer = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"http://127.0.0.1:{port}"
    server.stop(grace=None)


def test_grpc_protocol_exports_spans_to_a_grpc_collector(
    collector: tuple[_Collector, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    servicer, endpoint = collector
    # The exporter itself reads the endpoint from the process environment, as in `radixgate serve`.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    processor = build_span_processor(os.environ)
    assert processor is not None
    assert isinstance(processor._batch_processor._exporter, GrpcSpans)  # type: ignore[attr-defined]
    provider = TracerProvider()
    provider.add_span_processor(processor)
    provider.get_tracer("test").start_span("over grpc").end()
    provider.shutdown()  # flushes the batch
    assert servicer.received.wait(10)
    assert servicer.span_names == ["over grpc"]


def test_traces_protocol_variable_wins_over_the_generic_one(collector: tuple[_Collector, str]) -> None:
    _, endpoint = collector
    environ = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
    }
    processor = build_span_processor(environ)
    assert processor is not None
    assert isinstance(processor._batch_processor._exporter, GrpcSpans)  # type: ignore[attr-defined]
    processor.shutdown()
