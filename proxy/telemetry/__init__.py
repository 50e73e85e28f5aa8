"""OpenTelemetry traces, GenAI metrics and Prometheus `/metrics` for the gateway.

    telemetry = Telemetry.from_settings(settings.telemetry, service_version=__version__)
    app = Litestar([..., telemetry.metrics_handler], middleware=[telemetry.middleware])

    op = telemetry.start_operation(engine_request, lease.engine)   # CLIENT span, child of the server span
    engine_request.trace_headers = op.trace_headers                # the adapter forwards traceparent
    op.first_chunk(); op.succeed(...) or op.fail(error)

Convention names live in `proxy.telemetry.semconv`; the Prometheus registry other components
extend is `telemetry.prometheus` (`proxy.telemetry.prometheus.MetricsRegistry`).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from litestar import Response, get
from litestar.handlers import HTTPRouteHandler
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from adapters.base import Engine, EngineRequest
from proxy.telemetry import semconv
from proxy.telemetry.config import TelemetrySettings
from proxy.telemetry.middleware import ServerSpanMiddleware
from proxy.telemetry.operation import GenAIInstruments, Operation, request_attributes
from proxy.telemetry.prometheus import CONTENT_TYPE, GatewayMetrics, MetricsRegistry
from proxy.telemetry.providers import build_meter_provider, build_resource, build_span_processor

__all__ = ["MetricsRegistry", "Operation", "Telemetry", "TelemetrySettings"]


class Telemetry:
    """Owns the tracer, the meter and the Prometheus registry of one gateway app."""

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: otel_metrics.MeterProvider | None,
        service_version: str,
        owned: tuple[TracerProvider | MeterProvider, ...] = (),
    ) -> None:
        """Prefer `from_settings`. A None provider means "do not record" (the no-op implementation)."""
        self.tracer_provider = tracer_provider or trace.NoOpTracerProvider()
        self.meter_provider = meter_provider or otel_metrics.NoOpMeterProvider()
        self.tracer = self.tracer_provider.get_tracer(semconv.INSTRUMENTATION_SCOPE, service_version)
        """For other components' child spans (routing, cache)."""
        self.meter = self.meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE, service_version)
        self.prometheus = MetricsRegistry()
        """The registry behind `GET /metrics`; other components add their series here."""
        self.gateway_metrics = GatewayMetrics.register(self.prometheus)
        self._record_spans = not isinstance(self.tracer, trace.NoOpTracer)
        self._instruments = (
            None
            if isinstance(self.meter_provider, otel_metrics.NoOpMeterProvider)
            else GenAIInstruments.create(self.meter)
        )
        self._owned = owned
        self.middleware: Any = functools.partial(
            ServerSpanMiddleware, tracer=self.tracer, metrics=self.gateway_metrics
        )
        """ASGI middleware factory: `middleware(app=asgi_app)`; fits Litestar's `middleware=[...]`."""
        self.metrics_handler: HTTPRouteHandler = _metrics_handler(self.prometheus)
        """`GET /metrics` in the Prometheus text format."""

    @classmethod
    def from_settings(
        cls,
        settings: TelemetrySettings,
        *,
        service_version: str,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: otel_metrics.MeterProvider | None = None,
        span_processor: SpanProcessor | None = None,
    ) -> Telemetry:
        """Build from settings and the `OTEL_*` environment.

        Spans: an injected `tracer_provider` is used as is. Otherwise an SDK `TracerProvider` sends
        them to `span_processor`, or to the batch processor the `OTEL_*` variables configure; with
        neither, spans are not recorded. Metrics: an injected
        `meter_provider`, or one the variables configure, or none. Injected providers are left to
        their owner to shut down; what is built here (the span processor included) is shut down
        by `shutdown()`.
        """
        if not settings.enabled:
            return cls(tracer_provider=None, meter_provider=None, service_version=service_version)
        owned: list[TracerProvider | MeterProvider] = []
        resource = build_resource(settings.service_name, service_version)
        if tracer_provider is None:
            span_processor = span_processor or build_span_processor()
            if span_processor is not None:
                sdk_provider = TracerProvider(resource=resource)
                sdk_provider.add_span_processor(span_processor)
                tracer_provider = sdk_provider
                owned.append(sdk_provider)
        if meter_provider is None and (built_meter := build_meter_provider(resource)) is not None:
            meter_provider = built_meter
            owned.append(built_meter)
        return cls(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            service_version=service_version,
            owned=tuple(owned),
        )

    def start_operation(self, request: EngineRequest, engine: Engine) -> Operation:
        """Start the CLIENT span of one upstream call as a child of the current (server) span."""
        model = request.params.model
        if self._record_spans:
            span = self.tracer.start_span(
                semconv.client_span_name(request.operation, model),
                kind=trace.SpanKind.CLIENT,
                attributes=request_attributes(request, engine),
            )
        else:
            # The no-op tracer's span would be a non-recording copy of the current one (an incoming
            # traceparent, which then reaches the upstream, or the invalid span): take that one.
            span = trace.get_current_span()
        series = self.gateway_metrics.upstream(model, engine.provider_name, request.operation)
        return Operation(span, request, engine, self._instruments, series)

    async def shutdown(self) -> None:
        """Flush and stop the providers this object built (exporting may block, so off the loop)."""
        for provider in self._owned:
            await asyncio.to_thread(provider.shutdown)
        self._owned = ()


def _metrics_handler(registry: MetricsRegistry) -> HTTPRouteHandler:
    @get("/metrics", sync_to_thread=False, summary="Prometheus metrics", tags=["operations"])
    def metrics() -> Response[bytes]:
        return Response(registry.render(), media_type=CONTENT_TYPE)

    return metrics
