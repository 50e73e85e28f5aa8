"""The SERVER and GenAI CLIENT spans of a request, checked with an in-memory exporter."""

from __future__ import annotations

import json

from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from adapters.errors import UpstreamStatusError, UpstreamTimeout
from proxy.telemetry import Telemetry, TelemetrySettings, semconv
from tests.proxy.telemetry.conftest import ScriptedEngine, build_app, engine_request, spans_by_kind

CHAT_BODY = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "hello"}],
    "max_completion_tokens": 16,
    "temperature": 0.25,
    "top_p": 0.9,
    "seed": 7,
    "stop": "\n",
    "n": 2,
}
ANSWER = {
    "id": "chatcmpl-42",
    "object": "chat.completion",
    "model": "smollm2-135m-instruct",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": "hey"}, "finish_reason": "length"},
    ],
    "usage": {
        "prompt_tokens": 11,
        "completion_tokens": 5,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 8},
    },
}
INCOMING_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
INCOMING_PARENT = f"00-{INCOMING_TRACE_ID}-b7ad6b7169203331-01"


async def test_chat_request_makes_server_span_with_genai_client_child(
    telemetry: Telemetry, span_exporter: InMemorySpanExporter
) -> None:
    engine = ScriptedEngine(body=json.dumps(ANSWER).encode())
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT_BODY)
    assert response.status_code == 200

    spans = spans_by_kind(span_exporter)
    server, client_span = spans["SERVER"], spans["CLIENT"]
    assert server.name == "POST /v1/chat/completions"
    assert server.attributes is not None
    assert dict(server.attributes) == {
        semconv.HTTP_REQUEST_METHOD: "POST",
        semconv.URL_PATH: "/v1/chat/completions",
        semconv.URL_SCHEME: "http",
        semconv.NETWORK_PROTOCOL_VERSION: "1.1",
        semconv.HTTP_ROUTE: "/v1/chat/completions",
        semconv.HTTP_RESPONSE_STATUS_CODE: 200,
        # Litestar's test client: Host `testserver.local`, peer and User-Agent `testclient`.
        semconv.SERVER_ADDRESS: "testserver.local",
        semconv.SERVER_PORT: 80,
        semconv.CLIENT_ADDRESS: "testclient",
        semconv.USER_AGENT_ORIGINAL: "testclient",
    }
    assert server.status.status_code is StatusCode.UNSET

    assert client_span.name == "chat smollm2"
    assert client_span.parent is not None
    assert client_span.parent.span_id == server.context.span_id
    assert client_span.context.trace_id == server.context.trace_id
    assert client_span.attributes is not None
    assert dict(client_span.attributes) == {
        semconv.GEN_AI_OPERATION_NAME: "chat",
        semconv.GEN_AI_PROVIDER_NAME: "vllm",
        semconv.GEN_AI_REQUEST_MODEL: "smollm2",
        semconv.GEN_AI_REQUEST_STREAM: False,
        semconv.GEN_AI_REQUEST_MAX_TOKENS: 16,
        semconv.GEN_AI_REQUEST_TEMPERATURE: 0.25,
        semconv.GEN_AI_REQUEST_TOP_P: 0.9,
        semconv.GEN_AI_REQUEST_SEED: 7,
        semconv.GEN_AI_REQUEST_CHOICE_COUNT: 2,
        semconv.GEN_AI_REQUEST_STOP_SEQUENCES: ("\n",),
        semconv.SERVER_ADDRESS: "10.0.0.7",
        semconv.SERVER_PORT: 8000,
        semconv.GEN_AI_RESPONSE_ID: "chatcmpl-42",
        semconv.GEN_AI_RESPONSE_MODEL: "smollm2-135m-instruct",
        semconv.GEN_AI_RESPONSE_FINISH_REASONS: ("stop", "length"),
        semconv.GEN_AI_USAGE_INPUT_TOKENS: 11,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
        semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 8,
    }


async def test_incoming_traceparent_is_continued_and_client_span_is_sent_upstream(
    telemetry: Telemetry, span_exporter: InMemorySpanExporter
) -> None:
    engine = ScriptedEngine(body=json.dumps(ANSWER).encode())
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        await client.post(
            "/v1/chat/completions",
            json=CHAT_BODY,
            headers={"traceparent": INCOMING_PARENT, "tracestate": "vendor=abc"},
        )

    spans = spans_by_kind(span_exporter)
    server, client_span = spans["SERVER"], spans["CLIENT"]
    assert f"{server.context.trace_id:032x}" == INCOMING_TRACE_ID
    assert server.parent is not None and server.parent.is_remote
    assert f"{server.parent.span_id:016x}" == "b7ad6b7169203331"
    sent = engine.received[0].trace_headers
    assert sent["traceparent"] == f"00-{INCOMING_TRACE_ID}-{client_span.context.span_id:016x}-01"
    assert sent["tracestate"] == "vendor=abc"


async def test_text_completion_span_name_and_operation(
    telemetry: Telemetry, span_exporter: InMemorySpanExporter
) -> None:
    answer = {"id": "cmpl-1", "model": "m", "choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
    engine = ScriptedEngine(provider_name="sglang", server_port=None, body=json.dumps(answer).encode())
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        await client.post("/v1/completions", json={"model": "m", "prompt": "once", "max_tokens": 3})

    client_span = spans_by_kind(span_exporter)["CLIENT"]
    assert client_span.name == "text_completion m"
    assert client_span.attributes is not None
    assert client_span.attributes[semconv.GEN_AI_OPERATION_NAME] == "text_completion"
    assert client_span.attributes[semconv.GEN_AI_PROVIDER_NAME] == "sglang"
    assert client_span.attributes[semconv.GEN_AI_REQUEST_MAX_TOKENS] == 3
    assert semconv.SERVER_PORT not in client_span.attributes
    assert semconv.GEN_AI_USAGE_INPUT_TOKENS not in client_span.attributes


async def test_stream_records_time_to_first_chunk_and_final_usage(
    telemetry: Telemetry, span_exporter: InMemorySpanExporter
) -> None:
    chunks = [
        {"id": "chatcmpl-s", "model": "smollm2", "choices": [{"index": 0, "delta": {"content": "a"}}]},
        {"id": "chatcmpl-s", "model": "smollm2", "choices": [{"index": 0, "finish_reason": "stop"}]},
        {
            "id": "chatcmpl-s",
            "model": "smollm2",
            "choices": [],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        },
    ]
    engine = ScriptedEngine(chunks=[json.dumps(c).encode() for c in chunks])
    body = {**CHAT_BODY, "stream": True, "n": 1}
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.text.endswith("data: [DONE]\n\n")

    client_span = spans_by_kind(span_exporter)["CLIENT"]
    attributes = client_span.attributes
    assert attributes is not None
    assert attributes[semconv.GEN_AI_REQUEST_STREAM] is True
    ttfc = attributes[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK]
    assert isinstance(ttfc, float)
    assert client_span.end_time is not None and client_span.start_time is not None
    assert 0 < ttfc * 1e9 <= client_span.end_time - client_span.start_time
    assert attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 4
    assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS not in attributes


async def test_engine_error_sets_error_type_to_its_code_and_server_5xx_is_an_error(
    telemetry: Telemetry, span_exporter: InMemorySpanExporter
) -> None:
    engine = ScriptedEngine(error=UpstreamTimeout("engine did not answer in 30 s"))
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT_BODY)
    assert response.status_code == 504

    spans = spans_by_kind(span_exporter)
    client_span, server = spans["CLIENT"], spans["SERVER"]
    assert client_span.attributes is not None
    assert client_span.attributes[semconv.ERROR_TYPE] == "upstream_timeout"
    assert client_span.status.status_code is StatusCode.ERROR
    assert [event.name for event in client_span.events] == ["exception"]
    assert server.attributes is not None
    assert server.attributes[semconv.ERROR_TYPE] == "504"
    assert server.status.status_code is StatusCode.ERROR


async def test_relayed_4xx_is_a_client_error_but_not_a_server_error(
    telemetry: Telemetry, span_exporter: InMemorySpanExporter
) -> None:
    engine = ScriptedEngine(error=UpstreamStatusError(400, "max_tokens too large"))
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT_BODY)
    assert response.status_code == 400

    spans = spans_by_kind(span_exporter)
    assert spans["CLIENT"].attributes is not None
    assert spans["CLIENT"].attributes[semconv.ERROR_TYPE] == "400"  # no error code: the status
    assert spans["SERVER"].attributes is not None
    assert semconv.ERROR_TYPE not in spans["SERVER"].attributes
    assert spans["SERVER"].status.status_code is StatusCode.UNSET


async def test_unhandled_exception_marks_server_span(
    telemetry: Telemetry, span_exporter: InMemorySpanExporter
) -> None:
    async with AsyncTestClient(build_app(telemetry, ScriptedEngine())) as client:
        response = await client.post("/boom")
    assert response.status_code == 500

    server = spans_by_kind(span_exporter)["SERVER"]
    assert server.name == "POST /boom"
    assert server.attributes is not None
    assert server.attributes[semconv.ERROR_TYPE] == "500"


async def test_operation_ends_once(telemetry: Telemetry, span_exporter: InMemorySpanExporter) -> None:
    engine = ScriptedEngine()
    op = telemetry.start_operation(engine_request(json.dumps(CHAT_BODY).encode()), engine)
    op.succeed(response_id="a", response_model=None, finish_reasons=[], usage=None)
    op.fail(UpstreamTimeout("late"))
    op.first_chunk()

    (span,) = span_exporter.get_finished_spans()
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert span.attributes is not None
    assert semconv.ERROR_TYPE not in span.attributes


async def test_wrapping_the_whole_app_also_traces_unmatched_routes(
    telemetry: Telemetry, span_exporter: InMemorySpanExporter
) -> None:
    app = telemetry.middleware(app=build_app(telemetry, ScriptedEngine()))
    async with AsyncTestClient(app) as client:
        response = await client.get("/nowhere")
    assert response.status_code == 404

    (server,) = span_exporter.get_finished_spans()
    assert server.name == "GET"
    assert server.attributes is not None
    assert server.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 404
    assert semconv.HTTP_ROUTE not in server.attributes


async def test_disabled_telemetry_records_nothing_but_forwards_incoming_trace_context() -> None:
    telemetry = Telemetry.from_settings(TelemetrySettings(enabled=False), service_version="1")
    engine = ScriptedEngine(body=json.dumps(ANSWER).encode())
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        await client.post("/v1/chat/completions", json=CHAT_BODY, headers={"traceparent": INCOMING_PARENT})
        untraced = await client.post("/v1/chat/completions", json=CHAT_BODY)
    assert untraced.status_code == 200
    first, second = engine.received
    assert first.trace_headers == {"traceparent": INCOMING_PARENT}
    assert second.trace_headers == {}
