"""The span processor and meter provider that the standard `OTEL_*` environment variables choose.

    OTEL_SDK_DISABLED=true                         no spans, no OTel metrics
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / ..._ENDPOINT   spans go out over OTLP
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT / ..._ENDPOINT  GenAI metrics go out over OTLP
    OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]PROTOCOL  "http/protobuf" (default) or "grpc"
    OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER   "otlp" (default), "console" or "none"
    OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES    the resource (they win over the settings)

With no exporter nothing is built: spans are not recorded at all (the cheapest path), and an
incoming `traceparent` still reaches the upstream. The OTLP exporter itself reads the endpoint,
headers, timeout and compression variables; sampling follows `OTEL_TRACES_SAMPLER`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from proxy.telemetry import semconv

log = logging.getLogger(__name__)

HTTP_PROTOCOL = "http/protobuf"
GRPC_PROTOCOL = "grpc"
_GENERIC_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
_GENERIC_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"


def sdk_disabled(environ: Mapping[str, str] = os.environ) -> bool:
    """`OTEL_SDK_DISABLED=true`, read the way the SDK reads it."""
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def build_resource(service_name: str, service_version: str) -> Resource:
    """The settings' service name and version; `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` win."""
    base = Resource.create({semconv.SERVICE_NAME: service_name, semconv.SERVICE_VERSION: service_version})
    return base.merge(OTELResourceDetector().detect())


def build_span_processor(environ: Mapping[str, str] = os.environ) -> SpanProcessor | None:
    """A batch span processor around the configured exporter, or None when none is configured."""
    exporter = _span_exporter(environ)
    return BatchSpanProcessor(exporter) if exporter is not None else None


def build_meter_provider(resource: Resource, environ: Mapping[str, str] = os.environ) -> MeterProvider | None:
    """A provider exporting periodically (`OTEL_METRIC_EXPORT_INTERVAL`), or None without an exporter."""
    exporter = _metric_exporter(environ)
    if exporter is None:
        return None
    return MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(exporter)])


def _span_exporter(environ: Mapping[str, str]) -> SpanExporter | None:
    choice = _exporter_choice(environ, "OTEL_TRACES_EXPORTER", "TRACES")
    if choice == "console":
        return ConsoleSpanExporter()
    if choice == GRPC_PROTOCOL:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

        return GrpcSpans()
    if choice == HTTP_PROTOCOL:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    return None


def _metric_exporter(environ: Mapping[str, str]) -> MetricExporter | None:
    choice = _exporter_choice(environ, "OTEL_METRICS_EXPORTER", "METRICS")
    if choice == "console":
        return ConsoleMetricExporter()
    if choice == GRPC_PROTOCOL:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        return GrpcMetrics()
    if choice == HTTP_PROTOCOL:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    return None


def _exporter_choice(environ: Mapping[str, str], variable: str, signal: str) -> str | None:
    """ "console", an OTLP protocol (`HTTP_PROTOCOL`, `GRPC_PROTOCOL`) or None. OTLP needs an
    endpoint: without one nothing is exported."""
    if sdk_disabled(environ):
        return None
    names = [n.strip().lower() for n in environ.get(variable, "otlp").split(",") if n.strip()]
    if "console" in names:
        return "console"
    if "otlp" not in names:
        if names and names != ["none"]:
            log.warning("%s=%s is not supported; use otlp, console or none", variable, environ[variable])
        return None
    endpoint = environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint:
        return None
    protocol = environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    if protocol == GRPC_PROTOCOL:
        return GRPC_PROTOCOL
    if protocol and protocol != HTTP_PROTOCOL:
        log.warning("OTLP protocol %r is not supported; exporting over %s", protocol, HTTP_PROTOCOL)
    return HTTP_PROTOCOL
