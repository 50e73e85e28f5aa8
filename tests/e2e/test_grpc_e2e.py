"""The gRPC front door end to end: the real `tritonclient.grpc` against `radixgate serve --grpc-port`
in front of the test upstream, beside the openai SDK on the same gateway's HTTP port."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from tritonclient.utils import InferenceServerException

from proxy.telemetry import semconv
from tests.e2e.conftest import MODEL
from tests.e2e.grpc_support import API_KEY, AUTH, ServedGateway, is_final, output_text, text_inputs
from tests.proxy.telemetry.otlp_receiver import OTLPReceiver, ReceivedSpan, otlp_receiver
from tests.upstream_server import Fault, UpstreamServer

REPLY = "Hello from the test upstream."
GREEDY = {"max_tokens": 4, "temperature": 0}
CANCEL_WITHIN_S = 1.0
SERVICE = "inference.GRPCInferenceService"
STOPPED = (0, -signal.SIGTERM)
"""Exit statuses of a clean shutdown (uvicorn re-raises the signal once it has shut down)."""


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    with otlp_receiver() as started:
        yield started


@pytest.fixture(scope="module")
def served(
    upstream_server: UpstreamServer, receiver: OTLPReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedGateway]:
    config = f"""
[routing]
max_attempts = 1
health_interval_s = 30

[upstream_client]
read_timeout_s = 2.0

[[workers]]
url = "{upstream_server.url}"
models = ["{MODEL}"]
"""
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.endpoint}/v1/traces",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    gateway = ServedGateway(config, tmp_path_factory.mktemp("grpc"), env).start()
    yield gateway
    assert gateway.stop() in STOPPED, gateway.stderr
    assert "Traceback" not in gateway.stderr, gateway.stderr


@pytest.fixture
def triton(served: ServedGateway, upstream: UpstreamServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    yield client
    client.close()


def _code(error: InferenceServerException) -> str | None:
    status: str | None = error.status()
    return status


def _stream(
    client: grpcclient.InferenceServerClient, inputs: list[Any], *, empty_final: bool = False
) -> list[grpcclient.InferResult]:
    """One request on a stream; its responses up to the one marked final."""
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)), headers=AUTH)
    try:
        client.async_stream_infer(MODEL, inputs, request_id="s1", enable_empty_final_response=empty_final)
        results = []
        while True:
            result, error = responses.get(timeout=10)
            if error is not None:
                raise error
            results.append(result)
            if is_final(result):
                return results
    finally:
        client.stop_stream()


def test_liveness_readiness_and_metadata(
    served: ServedGateway, triton: grpcclient.InferenceServerClient
) -> None:
    assert triton.is_server_live(headers=AUTH)
    assert triton.is_server_ready(headers=AUTH)
    assert triton.is_model_ready(MODEL, headers=AUTH)
    assert not triton.is_model_ready("no-such-model", headers=AUTH)
    server = triton.get_server_metadata(headers=AUTH, as_json=True)
    assert server["name"] == "radixgate"
    model = triton.get_model_metadata(MODEL, headers=AUTH, as_json=True)
    assert [(t["name"], t["datatype"]) for t in model["inputs"]] == [
        ("text_input", "BYTES"),
        ("stream", "BOOL"),
        ("sampling_parameters", "BYTES"),
        ("exclude_input_in_output", "BOOL"),
    ]
    assert [(t["name"], t["datatype"]) for t in model["outputs"]] == [("text_output", "BYTES")]
    with pytest.raises(InferenceServerException) as caught:
        triton.get_model_metadata("no-such-model", headers=AUTH)
    assert _code(caught.value) == "StatusCode.NOT_FOUND"


def test_health_checking_follows_readiness_and_reflection_lists_the_services(served: ServedGateway) -> None:
    with grpc.insecure_channel(served.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE, MODEL):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert {SERVICE, "grpc.health.v1.Health"} <= set(services)


def test_infer_equals_http_completions(
    served: ServedGateway, triton: grpcclient.InferenceServerClient
) -> None:
    with openai.OpenAI(base_url=f"{served.http_url}/v1", api_key=API_KEY, max_retries=0) as sdk:
        http_text = sdk.completions.create(model=MODEL, prompt="Say hi", **GREEDY).choices[0].text
    result = triton.infer(MODEL, text_inputs("Say hi", GREEDY), headers=AUTH, request_id="r-1")
    assert output_text(result) == http_text == "Hello from the test upstream"[: len(http_text)]
    assert result.get_response().id == "r-1"
    # Without exclude_input_in_output the prompt comes first, as Triton's vLLM backend answers.
    whole = triton.infer(MODEL, text_inputs("Say hi", GREEDY, exclude_input=None), headers=AUTH)
    assert output_text(whole) == "Say hi" + http_text


def test_numbers_in_sampling_parameters_may_be_strings(
    triton: grpcclient.InferenceServerClient, upstream: UpstreamServer
) -> None:
    result = triton.infer(MODEL, text_inputs("p", {"max_tokens": "2", "temperature": "0.5"}), headers=AUTH)
    assert output_text(result) == "Hello from"
    sent = upstream.generation_requests()[0].json
    assert (sent["max_tokens"], sent["temperature"], sent["prompt"]) == (2, 0.5, "p")


def test_repeated_greedy_requests_share_the_response_cache(
    triton: grpcclient.InferenceServerClient, upstream: UpstreamServer
) -> None:
    texts = {
        output_text(triton.infer(MODEL, text_inputs("Cache me", GREEDY), headers=AUTH)) for _ in range(3)
    }
    assert texts == {"Hello from the test"}
    assert len(upstream.generation_requests()) < 3  # at least the last one was answered from the cache


def test_stream_chunks_add_up_to_the_whole_text(triton: grpcclient.InferenceServerClient) -> None:
    whole = output_text(triton.infer(MODEL, text_inputs("Stream me", {"max_tokens": 6}), headers=AUTH))
    results = _stream(triton, text_inputs("Stream me", {"max_tokens": 6}, stream=True))
    assert len(results) > 1
    assert "".join(output_text(r) for r in results) == whole == REPLY
    assert [is_final(r) for r in results] == [False] * (len(results) - 1) + [True]


def test_stream_with_an_empty_final_response(triton: grpcclient.InferenceServerClient) -> None:
    results = _stream(triton, text_inputs("Again", {"max_tokens": 6}, stream=True), empty_final=True)
    *texts, final = results
    assert "".join(output_text(r) for r in texts) == REPLY
    assert not any(is_final(r) for r in texts)
    assert final.as_numpy("text_output") is None  # the extra final response has no outputs


def test_a_request_without_stream_on_a_stream_is_one_final_response(
    triton: grpcclient.InferenceServerClient,
) -> None:
    (result,) = _stream(triton, text_inputs("Once", {"max_tokens": 6}, stream=False, exclude_input=False))
    assert output_text(result) == "Once" + REPLY


def test_requests_on_one_stream_are_answered_by_id(triton: grpcclient.InferenceServerClient) -> None:
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    triton.start_stream(callback=lambda result, error: responses.put((result, error)), headers=AUTH)
    try:
        for number in range(3):
            inputs = text_inputs(f"Stream {number}", {"max_tokens": number + 2}, stream=True)
            triton.async_stream_infer(MODEL, inputs, request_id=f"id-{number}")
        texts: dict[str, str] = {}
        finished: set[str] = set()
        while len(finished) < 3:
            result, error = responses.get(timeout=10)
            assert error is None, error
            request_id = result.get_response().id
            texts[request_id] = texts.get(request_id, "") + output_text(result)
            if is_final(result):
                finished.add(request_id)
    finally:
        triton.stop_stream()
    assert texts == {f"id-{n}": " ".join(REPLY.split(" ")[: n + 2]) for n in range(3)}


@pytest.mark.parametrize("headers", [None, {"authorization": "Bearer wrong-key"}])
def test_a_missing_or_invalid_key_is_unauthenticated(
    triton: grpcclient.InferenceServerClient, headers: dict[str, str] | None
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        triton.infer(MODEL, text_inputs("x"), headers=headers)
    assert _code(caught.value) == "StatusCode.UNAUTHENTICATED"
    errors: queue.Queue[Any] = queue.Queue()
    triton.start_stream(callback=lambda result, error: errors.put(error), headers=headers)
    # The stream ends as soon as it opens; a request sent after that is refused by the client itself.
    with contextlib.suppress(InferenceServerException):
        triton.async_stream_infer(MODEL, text_inputs("x", stream=True))
    error = errors.get(timeout=10)
    triton.stop_stream()
    assert _code(error) == "StatusCode.UNAUTHENTICATED"


def test_unknown_model_is_not_found(triton: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        triton.infer("no-such-model", text_inputs("x"), headers=AUTH)
    assert _code(caught.value) == "StatusCode.NOT_FOUND"
    assert "no-such-model" in caught.value.message()


def _typed(name: str, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], datatype)
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32 if datatype == "INT32" else np.float32))
    return tensor


@pytest.mark.parametrize(
    ("inputs", "named"),
    [
        ([], "text_input"),
        ([_typed("text_input", "INT32")], "text_input"),
        ([*text_inputs("x"), _typed("temperature", "FP32")], "temperature"),
        (text_inputs("x", {"max_tokens": "many"}), "sampling_parameters"),
        (text_inputs("x", {"prompt": "y"}), "sampling_parameters"),
        (text_inputs("x", {"max_tokens": [1]}), "max_tokens"),
        (text_inputs("x", stream=True), "stream"),
    ],
    ids=["no-text", "int-text", "unknown-input", "bad-number", "reserved-field", "wrong-type", "stream"],
)
def test_a_malformed_request_is_invalid_argument(
    triton: grpcclient.InferenceServerClient, inputs: list[Any], named: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        triton.infer(MODEL, inputs, headers=AUTH)
    assert _code(caught.value) == "StatusCode.INVALID_ARGUMENT"
    assert named in caught.value.message()


def test_a_bad_request_on_a_stream_is_answered_in_band(triton: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _stream(triton, text_inputs("x", {"max_tokens": "many"}, stream=True))
    assert "sampling_parameters" in caught.value.message()


def test_upstream_timeout_is_deadline_exceeded(
    triton: grpcclient.InferenceServerClient, upstream: UpstreamServer
) -> None:
    upstream.faults.append(Fault(delay_s=2.5))  # past the gateway's 2 s read timeout
    with pytest.raises(InferenceServerException) as caught:
        triton.infer(MODEL, text_inputs("slow"), headers=AUTH)
    assert _code(caught.value) == "StatusCode.DEADLINE_EXCEEDED"


def test_upstream_down_is_unavailable(
    triton: grpcclient.InferenceServerClient, upstream: UpstreamServer
) -> None:
    upstream.faults.append(Fault(status=503))
    with pytest.raises(InferenceServerException) as caught:
        triton.infer(MODEL, text_inputs("busy"), headers=AUTH)
    assert _code(caught.value) == "StatusCode.UNAVAILABLE"


def _assert_upstream_cancelled(upstream: UpstreamServer, gave_up_at: float) -> None:
    received = upstream.generation_requests()[0]
    assert received.disconnected.wait(CANCEL_WITHIN_S + 1), "the upstream never saw its connection closed"
    assert received.disconnected_at is not None
    assert received.disconnected_at - gave_up_at < CANCEL_WITHIN_S


def test_cancel_mid_stream_cancels_the_upstream(
    served: ServedGateway, triton: grpcclient.InferenceServerClient, upstream: UpstreamServer
) -> None:
    upstream.faults.append(Fault(chunk_delay_s=0.25))
    responses: queue.Queue[Any] = queue.Queue()
    triton.start_stream(callback=lambda result, error: responses.put(result), headers=AUTH)
    triton.async_stream_infer(MODEL, text_inputs("Cancel me", {"max_tokens": 6}, stream=True))
    first = responses.get(timeout=5)
    assert first is not None and not is_final(first)
    triton.stop_stream(cancel_requests=True)
    gave_up_at = time.monotonic()
    _assert_upstream_cancelled(upstream, gave_up_at)
    assert served.wait_idle() == 0


def test_cancel_before_the_answer_cancels_the_upstream(
    served: ServedGateway, triton: grpcclient.InferenceServerClient, upstream: UpstreamServer
) -> None:
    upstream.faults.append(Fault(delay_s=1.8))
    call = triton.async_infer(
        MODEL, text_inputs("Cancel early"), callback=lambda result, error: None, headers=AUTH
    )
    deadline = time.monotonic() + 5
    while not upstream.generation_requests() and time.monotonic() < deadline:
        time.sleep(0.01)
    call.cancel()
    gave_up_at = time.monotonic()
    _assert_upstream_cancelled(upstream, gave_up_at)
    assert served.wait_idle() == 0


async def test_fifty_concurrent_streams_all_complete(served: ServedGateway, upstream: UpstreamServer) -> None:
    async def one_stream(client: grpcclient_aio.InferenceServerClient, number: int) -> str:
        async def requests() -> Any:
            # A distinct prompt per stream, so the response cache answers none of them.
            inputs = text_inputs(f"stream {number}", {"max_tokens": 6}, stream=True)
            yield {"model_name": MODEL, "inputs": inputs, "request_id": str(number)}

        parts = []
        async for result, error in client.stream_infer(requests(), headers=AUTH):
            assert error is None, error
            parts.append(output_text(result))
            if is_final(result):
                break
        return "".join(parts)

    client = grpcclient_aio.InferenceServerClient(served.grpc_url)
    try:
        texts = await asyncio.wait_for(asyncio.gather(*(one_stream(client, n) for n in range(50))), 60)
    finally:
        await client.close()
    assert texts == [REPLY] * 50
    assert len(upstream.generation_requests()) == 50
    assert served.wait_idle() == 0


def _trace(receiver: OTLPReceiver, trace_id: str) -> list[ReceivedSpan]:
    """The server and client spans of one trace, once both have been exported."""
    deadline = time.monotonic() + 5
    while True:
        spans = [s for s in receiver.spans() if s.span.trace_id.hex() == trace_id]
        if len(spans) >= 2 or time.monotonic() > deadline:
            return spans
        time.sleep(0.05)


def test_one_server_span_per_call_in_the_callers_trace(
    triton: grpcclient.InferenceServerClient, receiver: OTLPReceiver
) -> None:
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    headers = {**AUTH, "traceparent": f"00-{trace_id}-{parent_id}-01"}
    triton.infer(MODEL, text_inputs("Traced", GREEDY), headers=headers)
    spans = _trace(receiver, trace_id)
    server = next(s for s in spans if s.span.kind == ProtoSpan.SPAN_KIND_SERVER)
    client = next(s for s in spans if s.span.kind == ProtoSpan.SPAN_KIND_CLIENT)
    assert server.span.name == f"{SERVICE}/ModelInfer"
    assert server.span.parent_span_id.hex() == parent_id
    assert client.span.parent_span_id == server.span.span_id
    attributes = server.attributes
    assert attributes[semconv.RPC_SYSTEM] == "grpc"
    assert attributes[semconv.RPC_METHOD] == "ModelInfer"
    assert attributes[semconv.RPC_GRPC_STATUS_CODE] == 0
    assert attributes[semconv.GEN_AI_OPERATION_NAME] == "text_completion"
    assert attributes[semconv.GEN_AI_REQUEST_MODEL] == MODEL
    assert attributes[semconv.GEN_AI_REQUEST_STREAM] is False


def test_a_streamed_request_has_its_server_span_too(
    triton: grpcclient.InferenceServerClient, receiver: OTLPReceiver
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    responses: queue.Queue[Any] = queue.Queue()
    headers = {**AUTH, "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    triton.start_stream(callback=lambda result, error: responses.put(result), headers=headers)
    triton.async_stream_infer(MODEL, text_inputs("Traced stream", {"max_tokens": 3}, stream=True))
    while not is_final(responses.get(timeout=10)):
        pass
    triton.stop_stream()
    server = next(s for s in _trace(receiver, trace_id) if s.span.kind == ProtoSpan.SPAN_KIND_SERVER)
    assert server.span.name == f"{SERVICE}/ModelStreamInfer"
    assert server.attributes[semconv.GEN_AI_REQUEST_STREAM] is True
    assert server.attributes[semconv.RPC_GRPC_STATUS_CODE] == 0


def test_the_grpc_port_stops_with_the_gateway(tmp_path: Path, upstream_server: UpstreamServer) -> None:
    config = f'[[workers]]\nurl = "{upstream_server.url}"\nmodels = ["{MODEL}"]\n'
    gateway = ServedGateway(config, tmp_path).start()
    client = grpcclient.InferenceServerClient(gateway.grpc_url)
    assert client.is_server_live()
    assert gateway.stop() in STOPPED, gateway.stderr
    with pytest.raises(InferenceServerException):
        client.is_server_live(client_timeout=2)
    client.close()


def test_a_tenant_over_its_limit_is_resource_exhausted(
    upstream_server: UpstreamServer, tmp_path: Path
) -> None:
    config = f"""
[auth.tenants.grpc-tests]
requests_per_minute = 1

[routing]
health_interval_s = 30

[[workers]]
url = "{upstream_server.url}"
models = ["{MODEL}"]
"""
    gateway = ServedGateway(config, tmp_path).start()
    try:
        client = grpcclient.InferenceServerClient(gateway.grpc_url)
        assert output_text(client.infer(MODEL, text_inputs("once"), headers=AUTH))
        with pytest.raises(InferenceServerException) as caught:
            client.infer(MODEL, text_inputs("twice"), headers=AUTH)
        assert _code(caught.value) == "StatusCode.RESOURCE_EXHAUSTED"
        client.close()
    finally:
        assert gateway.stop() in STOPPED, gateway.stderr
