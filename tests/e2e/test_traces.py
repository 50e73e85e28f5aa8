"""Traces of real requests: openai SDK -> gateway (uvicorn) -> test upstream.

One gateway records into in-memory exporters; another exports over OTLP/HTTP to a receiver
on loopback that decodes the protobuf, as a collector would.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy.app import create_app
from proxy.telemetry import Telemetry, TelemetrySettings, semconv
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.proxy.telemetry.conftest import metric_points
from tests.proxy.telemetry.otlp_receiver import otlp_receiver
from tests.upstream_server import CACHED_TOKENS, Fault, UpstreamServer

CALLER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_PARENT = f"00-{CALLER_TRACE_ID}-00f067aa0ba902b7-01"


class Recorded:
    """A gateway whose telemetry records into memory."""

    def __init__(self, *upstreams: UpstreamServer) -> None:
        self.spans = InMemorySpanExporter()
        self.metrics = InMemoryMetricReader()
        self._tracer_provider = TracerProvider()
        self._tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self._meter_provider = MeterProvider(metric_readers=[self.metrics])
        telemetry = Telemetry.from_settings(
            TelemetrySettings(),
            service_version="test",
            tracer_provider=self._tracer_provider,
            meter_provider=self._meter_provider,
        )
        self.server = GatewayServer(
            create_app(gateway_settings(*(u.url for u in upstreams)), telemetry=telemetry)
        ).start()

    def close(self) -> None:
        self.server.stop()
        self._tracer_provider.shutdown()
        self._meter_provider.shutdown()

    def request_spans(self) -> tuple[ReadableSpan, list[ReadableSpan]]:
        """The one SERVER span of a generation request and its CLIENT children."""
        finished = self.spans.get_finished_spans()
        (server,) = [s for s in finished if s.kind is SpanKind.SERVER and "completions" in s.name]
        children = [s for s in finished if s.kind is SpanKind.CLIENT]
        return server, children


@pytest.fixture(scope="module")
def recorded(upstream_server: UpstreamServer) -> Iterator[Recorded]:
    gateway = Recorded(upstream_server)
    yield gateway
    gateway.close()


@pytest.fixture
def traced(recorded: Recorded, upstream: UpstreamServer) -> Recorded:
    recorded.spans.clear()
    return recorded


def test_chat_request_has_server_span_with_genai_client_child(
    traced: Recorded, upstream: UpstreamServer
) -> None:
    with openai.OpenAI(base_url=traced.server.url, api_key="k", max_retries=0) as sdk:
        reply = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            temperature=0.5,
            top_p=0.75,
            seed=11,
            extra_headers={"traceparent": CALLER_PARENT},
        )

    server, (client,) = traced.request_spans()
    assert server.name == "POST /v1/chat/completions"
    assert f"{server.context.trace_id:032x}" == CALLER_TRACE_ID
    assert server.attributes is not None
    assert server.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 200
    assert server.attributes[semconv.HTTP_ROUTE] == "/v1/chat/completions"

    assert client.name == f"chat {MODEL}"
    assert client.parent is not None and client.parent.span_id == server.context.span_id
    attributes = client.attributes
    assert attributes is not None
    assert attributes[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert attributes[semconv.GEN_AI_PROVIDER_NAME] == "openai"
    assert attributes[semconv.GEN_AI_REQUEST_MODEL] == MODEL
    assert attributes[semconv.GEN_AI_REQUEST_MAX_TOKENS] == 4
    assert attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] == 0.5
    assert attributes[semconv.GEN_AI_REQUEST_TOP_P] == 0.75
    assert attributes[semconv.GEN_AI_REQUEST_SEED] == 11
    assert attributes[semconv.GEN_AI_REQUEST_STREAM] is False
    assert attributes[semconv.GEN_AI_RESPONSE_ID] == reply.id
    assert attributes[semconv.GEN_AI_RESPONSE_MODEL] == reply.model
    assert attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == (reply.choices[0].finish_reason,)
    assert reply.usage is not None
    assert attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == reply.usage.prompt_tokens
    assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == reply.usage.completion_tokens
    assert attributes[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == CACHED_TOKENS
    assert attributes[semconv.SERVER_ADDRESS] == "127.0.0.1"
    assert attributes[semconv.SERVER_PORT] == upstream.port

    (received,) = upstream.generation_requests()
    version, trace_id, parent_id, _ = received.headers["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", CALLER_TRACE_ID, f"{client.context.span_id:016x}")


async def test_stream_span_records_time_to_first_chunk(traced: Recorded, upstream: UpstreamServer) -> None:
    sdk = openai.AsyncOpenAI(base_url=traced.server.url, api_key="k", max_retries=0)
    async with sdk:
        stream = await sdk.completions.create(
            model=MODEL, prompt="once upon", max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None

    server, (client,) = traced.request_spans()
    assert server.name == "POST /v1/completions"
    assert client.name == f"text_completion {MODEL}"
    attributes = client.attributes
    assert attributes is not None
    assert attributes[semconv.GEN_AI_REQUEST_STREAM] is True
    assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == chunks[-1].usage.completion_tokens
    assert 0 < attributes[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] < 1  # type: ignore[operator]
    points = metric_points(traced.metrics.get_metrics_data())
    ttfc = [
        p
        for p in points[semconv.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK]
        if isinstance(p, HistogramDataPoint)
    ]
    assert sum(p.count for p in ttfc) >= 1


def test_retried_request_has_one_client_span_per_attempt(upstream: UpstreamServer) -> None:
    second = UpstreamServer(models=(MODEL,)).start()
    gateway = Recorded(upstream, second)
    servers = (upstream, second)
    message = [{"role": "user", "content": "again"}]
    try:
        with openai.OpenAI(base_url=gateway.server.url, api_key="k", max_retries=0) as sdk:
            # Learn which worker the router picks for this prompt, make it answer 503 once, and send
            # the prompt until that worker has met the fault (a router may also alternate).
            before = [len(s.generation_requests()) for s in servers]
            sdk.chat.completions.create(model=MODEL, messages=message)
            after = [len(s.generation_requests()) for s in servers]
            target = servers[[a - b for a, b in zip(after, before, strict=True)].index(1)]
            target.faults.append(Fault(status=503))
            for _ in range(4):
                gateway.spans.clear()
                sdk.chat.completions.create(model=MODEL, messages=message)
                if not target.faults:
                    break
        server, clients = gateway.request_spans()
    finally:
        gateway.close()
        second.stop()

    assert len(clients) == 2
    failed, succeeded = sorted(clients, key=lambda span: span.start_time or 0)
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None
    assert failed.attributes[semconv.ERROR_TYPE] == "injected"  # the upstream's own error code
    assert succeeded.status.status_code is StatusCode.UNSET
    assert {span.parent.span_id for span in clients if span.parent} == {server.context.span_id}
    assert server.status.status_code is StatusCode.UNSET


def test_upstream_error_marks_client_and_server_spans(traced: Recorded, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(status=500))
    with (
        openai.OpenAI(base_url=traced.server.url, api_key="k", max_retries=0) as sdk,
        pytest.raises(openai.APIStatusError) as caught,
    ):
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "fail"}])
    assert caught.value.status_code == 502

    server, (client,) = traced.request_spans()
    assert client.status.status_code is StatusCode.ERROR
    assert client.attributes is not None
    assert client.attributes[semconv.ERROR_TYPE] == "injected"
    assert server.attributes is not None
    assert server.attributes[semconv.ERROR_TYPE] == "502"
    assert server.status.status_code is StatusCode.ERROR


def test_spans_reach_an_otlp_http_receiver(monkeypatch: pytest.MonkeyPatch, upstream: UpstreamServer) -> None:
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.endpoint}/v1/traces")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "radixgate-e2e")
        app = create_app(gateway_settings(upstream.url))  # telemetry from settings and OTEL_* variables
        gateway = GatewayServer(app).start()
        try:
            with openai.OpenAI(base_url=gateway.url, api_key="k", max_retries=0) as sdk:
                reply = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        finally:
            gateway.stop()  # the lifespan's shutdown flushes the batch span processor

    spans = {(s.span.kind, s.span.name): s for s in receiver.spans()}
    server = spans[(ProtoSpan.SPAN_KIND_SERVER, "POST /v1/chat/completions")]
    client = spans[(ProtoSpan.SPAN_KIND_CLIENT, f"chat {MODEL}")]
    assert server.resource["service.name"] == "radixgate-e2e"
    assert client.span.parent_span_id == server.span.span_id
    assert client.attributes[semconv.GEN_AI_RESPONSE_ID] == reply.id
    (received,) = upstream.generation_requests()
    assert received.headers["traceparent"].split("-")[2] == client.span.span_id.hex()
