"""A tiny OTLP/HTTP receiver on loopback: accepts protobuf POSTs to /v1/traces and /v1/metrics and
decodes them with the collector's own message types, as a real collector would."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


@dataclass
class ReceivedSpan:
    """One span as it arrived, with its resource attributes."""

    span: Span
    resource: dict[str, Any]

    @property
    def attributes(self) -> dict[str, Any]:
        return {kv.key: any_value(kv.value) for kv in self.span.attributes}


@dataclass
class OTLPReceiver:
    endpoint: str
    trace_requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    metric_requests: list[ExportMetricsServiceRequest] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)

    def spans(self) -> list[ReceivedSpan]:
        found = []
        for request in self.trace_requests:
            for resource_spans in request.resource_spans:
                resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    found.extend(ReceivedSpan(span, resource) for span in scope_spans.spans)
        return found

    def metric_names(self) -> set[str]:
        return {
            metric.name
            for request in self.metric_requests
            for resource_metrics in request.resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
        }

    def histogram_bounds(self, name: str) -> list[float]:
        for request in self.metric_requests:
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        if metric.name == name:
                            return list(metric.histogram.data_points[0].explicit_bounds)
        raise KeyError(name)


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(any_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


@contextmanager
def otlp_receiver() -> Iterator[OTLPReceiver]:
    """Serve on 127.0.0.1 (a free port) for the duration of the block."""
    receiver = OTLPReceiver(endpoint="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            receiver.content_types.add(self.headers["Content-Type"])
            if self.path == "/v1/traces":
                receiver.trace_requests.append(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
            elif self.path == "/v1/metrics":
                receiver.metric_requests.append(ExportMetricsServiceRequest.FromString(body))
                reply = ExportMetricsServiceResponse().SerializeToString()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
