"""Spans and GenAI metrics leave the process over OTLP/HTTP protobuf, chosen by `OTEL_*` variables."""

from __future__ import annotations

import json

import pytest
from litestar.testing import AsyncTestClient
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from proxy.telemetry import Telemetry, TelemetrySettings, semconv
from tests.proxy.telemetry.conftest import ScriptedEngine, build_app
from tests.proxy.telemetry.otlp_receiver import otlp_receiver

ANSWER = {
    "id": "chatcmpl-w",
    "model": "smollm2",
    "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}


async def test_request_spans_and_metrics_arrive_at_an_otlp_http_receiver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "radixgate-wire-test")
        telemetry = Telemetry.from_settings(TelemetrySettings(), service_version="0.1.0")
        engine = ScriptedEngine(body=json.dumps(ANSWER).encode())
        async with AsyncTestClient(build_app(telemetry, engine)) as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "smollm2", "messages": [{"role": "user", "content": "x"}]},
            )
        assert response.status_code == 200
        await telemetry.shutdown()  # flushes the batch processor and the periodic metric reader

    assert receiver.content_types == {"application/x-protobuf"}
    spans = {received.span.kind: received for received in receiver.spans()}
    server, client = spans[Span.SPAN_KIND_SERVER], spans[Span.SPAN_KIND_CLIENT]
    assert server.resource["service.name"] == "radixgate-wire-test"
    assert server.resource["service.version"] == "0.1.0"
    assert server.span.name == "POST /v1/chat/completions"
    assert client.span.name == "chat smollm2"
    assert client.span.trace_id == server.span.trace_id
    assert client.span.parent_span_id == server.span.span_id
    assert client.attributes[semconv.GEN_AI_RESPONSE_ID] == "chatcmpl-w"
    assert client.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 5
    assert client.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    version, trace_id, parent_id, flags = engine.received[0].trace_headers["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", client.span.trace_id.hex(), client.span.span_id.hex())
    assert int(flags, 16) & 1  # sampled

    assert {
        semconv.GEN_AI_CLIENT_OPERATION_DURATION,
        semconv.GEN_AI_CLIENT_TOKEN_USAGE,
    } <= receiver.metric_names()
    bounds = receiver.histogram_bounds(semconv.GEN_AI_CLIENT_OPERATION_DURATION)
    assert bounds == list(semconv.DURATION_BUCKETS)
