"""A miniature gateway path around `Telemetry`: an app whose handler does what the real
request path does (start the operation, call the engine, end the operation), with in-memory
span and metric exporters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import msgspec
import pytest
from litestar import Litestar, Request, Response, post
from litestar.response import Stream
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from adapters.base import Completion, EngineRequest
from adapters.errors import EngineError
from adapters.schema import ChatCompletionRequest, CompletionRequest, GenerationRequest, probe_response
from proxy.telemetry import Telemetry, TelemetrySettings


@dataclass(slots=True)
class ScriptedEngine:
    """An in-process engine answering from a script: a body, a list of chunks, or an error."""

    provider_name: str = "vllm"
    server_address: str = "10.0.0.7"
    server_port: int | None = 8000
    body: bytes = b""
    chunks: list[bytes] = field(default_factory=list)
    error: EngineError | None = None
    received: list[EngineRequest] = field(default_factory=list)

    async def complete(self, request: EngineRequest) -> Completion:
        self.received.append(request)
        if self.error is not None:
            raise self.error
        probe = probe_response(self.body)
        return Completion(
            body=self.body,
            usage=probe.usage,
            response_id=probe.id,
            response_model=probe.model,
            finish_reasons=[c.finish_reason for c in probe.choices if c.finish_reason],
        )

    async def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        self.received.append(request)
        if self.error is not None:
            raise self.error
        for chunk in self.chunks:
            yield chunk

    async def check_health(self) -> bool:
        return self.error is None

    async def aclose(self) -> None:
        self.received.clear()


def _decode(operation: str, body: bytes) -> GenerationRequest:
    if operation == "chat":
        return msgspec.json.decode(body, type=ChatCompletionRequest)
    # msgspec cannot decode `CompletionRequest.prompt`'s union of several list types directly.
    return CompletionRequest(**msgspec.json.decode(body))


def engine_request(body: bytes, operation: str = "chat") -> EngineRequest:
    """An `EngineRequest` as the gateway builds it from a client body."""
    return EngineRequest(
        operation="chat" if operation == "chat" else "text_completion",
        params=_decode(operation, body),
        raw_body=body,
        request_id="req-1",
        tenant_id="anonymous",
        cache_salt="salt",
    )


def build_app(telemetry: Telemetry, engine: ScriptedEngine) -> Litestar:
    """Two generation routes that use `Telemetry` the way the gateway's request path does."""

    async def run(operation: str, raw: bytes) -> Response[bytes] | Stream:
        request = engine_request(raw, operation)
        params = request.params
        op = telemetry.start_operation(request, engine)
        request.trace_headers = op.trace_headers
        if not params.stream:
            try:
                completion = await engine.complete(request)
            except EngineError as exc:
                op.fail(exc)
                return Response(b'{"error":{}}', status_code=exc.status, media_type="application/json")
            op.succeed(
                response_id=completion.response_id,
                response_model=completion.response_model,
                finish_reasons=completion.finish_reasons,
                usage=completion.usage,
            )
            return Response(completion.body, media_type="application/json")

        async def relay() -> AsyncIterator[bytes]:
            last = None
            try:
                async for chunk in engine.stream(request):
                    op.first_chunk()
                    last = probe_response(chunk)
                    yield b"data: " + chunk + b"\n\n"
            except EngineError as exc:
                op.fail(exc)
                return
            op.succeed(
                response_id=last.id if last else None,
                response_model=last.model if last else None,
                finish_reasons=[c.finish_reason for c in last.choices if c.finish_reason] if last else [],
                usage=last.usage if last else None,
            )
            yield b"data: [DONE]\n\n"

        return Stream(relay(), media_type="text/event-stream")

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request) -> Response[bytes] | Stream:
        return await run("chat", await request.body())

    @post("/v1/completions", status_code=200)
    async def completions(request: Request) -> Response[bytes] | Stream:
        return await run("text_completion", await request.body())

    @post("/boom")
    async def boom() -> None:
        raise RuntimeError("handler bug")

    return Litestar([chat, completions, boom, telemetry.metrics_handler], middleware=[telemetry.middleware])


@pytest.fixture
def span_exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def metric_reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture(params=["lean", "sdk"])
def telemetry(
    request: pytest.FixtureRequest, span_exporter: InMemorySpanExporter, metric_reader: InMemoryMetricReader
) -> Iterator[Telemetry]:
    """Telemetry recording into memory: through the lean tracer (what the gateway uses when it
    exports) and through an injected SDK `TracerProvider`; both must produce the same spans."""
    meter_provider = MeterProvider(metric_readers=[metric_reader])
    if request.param == "lean":
        telemetry = Telemetry.from_settings(
            TelemetrySettings(),
            service_version="9.9.9",
            span_processor=SimpleSpanProcessor(span_exporter),
            meter_provider=meter_provider,
        )
        yield telemetry
        asyncio.run(telemetry.shutdown())
    else:
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        yield Telemetry.from_settings(
            TelemetrySettings(),
            service_version="9.9.9",
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
        )
        tracer_provider.shutdown()
    meter_provider.shutdown()


def spans_by_kind(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The finished spans keyed by kind name ("SERVER", "CLIENT"); each kind must occur once."""
    spans: dict[str, ReadableSpan] = {}
    for span in exporter.get_finished_spans():
        assert span.kind.name not in spans, f"two {span.kind.name} spans"
        spans[span.kind.name] = span
    return spans


def metric_points(data: MetricsData | None) -> dict[str, list[object]]:
    """Data points of every metric, keyed by metric name."""
    points: dict[str, list[object]] = {}
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points
