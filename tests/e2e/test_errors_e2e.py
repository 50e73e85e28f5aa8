"""Every error the gateway answers is OpenAI-shaped, with the right status, and the SDK raises the
matching exception; streams that fail midway end with an error event the SDK raises as APIError."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.app import create_app
from proxy.routing.config import RoutingSettings
from proxy.settings import ServerSettings
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import Fault, UpstreamServer

MESSAGES: Any = [{"role": "user", "content": "Say hello"}]
ANSWER = "Hello from the test upstream."


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


@pytest.fixture(scope="module")
def small_body_gateway(upstream_server: UpstreamServer) -> Iterator[GatewayServer]:
    settings = gateway_settings(upstream_server.url, server=ServerSettings(max_body_bytes=1024))
    server = GatewayServer(create_app(settings)).start()
    yield server
    server.stop()


def test_malformed_json_is_400(gateway: GatewayServer) -> None:
    response = httpx.post(f"{gateway.url}/chat/completions", content=b'{"model": "test-model", "messages": [')
    assert _error(response, 400)["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": MESSAGES, "n": "two"}, "n"),
        (
            {"model": MODEL, "messages": MESSAGES, "stream_options": {"include_usage": 3}},
            "stream_options.include_usage",
        ),
        ({"messages": MESSAGES}, "model"),
        ({"model": MODEL}, "messages"),
    ],
)
def test_invalid_field_is_400_naming_it(gateway: GatewayServer, body: dict[str, Any], param: str) -> None:
    error = _error(httpx.post(f"{gateway.url}/chat/completions", json=body), 400)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_invalid_field_raises_bad_request_in_the_sdk(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt={"not": "a prompt"})
    assert caught.value.param == "prompt"


def test_unknown_model_is_404_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert caught.value.code == "model_not_found"
    assert caught.value.param == "model"


def test_body_too_large_is_413(small_body_gateway: GatewayServer) -> None:
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 2000}]}
    assert (
        _error(httpx.post(f"{small_body_gateway.url}/chat/completions", json=big), 413)["code"]
        == "request_too_large"
    )

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
        yield b'{"model": "test-model", "messages": [{"role": "user", "content": "'
        yield b"x" * 2000
        yield b'"}]}'

    response = httpx.post(f"{small_body_gateway.url}/completions", content=chunked())
    assert _error(response, 413)["code"] == "request_too_large"


def test_wrong_method_is_405(gateway: GatewayServer) -> None:
    response = httpx.get(f"{gateway.url}/chat/completions")
    assert _error(response, 405)["code"] == "method_not_allowed"
    assert response.headers["allow"] == "POST"
    response = httpx.delete(f"{gateway.url}/models")
    assert _error(response, 405)["code"] == "method_not_allowed"
    assert "GET" in response.headers["allow"]


def test_unknown_route_is_404(gateway: GatewayServer) -> None:
    assert _error(httpx.post(f"{gateway.url}/images/generations", json={}), 404)["code"] == "unknown_url"


def test_upstream_4xx_is_relayed_with_its_message(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(status=400, message="This model's maximum context length is 8 tokens"))
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert "maximum context length is 8 tokens" in caught.value.message
    assert caught.value.param == "messages"
    assert len(upstream.generation_requests()) == 1  # a client error is not retried


def test_upstream_429_is_relayed(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    upstream.faults.extend([Fault(status=429, message="Rate limit reached")])
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    assert "Rate limit reached" in caught.value.message


def test_upstream_5xx_is_502(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(status=500, message="engine crashed"))
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert caught.value.status_code == 502
    assert "engine crashed" in caught.value.message


def test_upstream_timeout_is_504(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(delay_s=3.0))
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"


def test_stream_cut_midway_ends_with_an_error_event(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(drop_after_chunks=3))
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True):
            received.append(chunk.choices[0].delta.content or "")
    assert received == ["", "Hello", " from"]
    assert "upstream" in caught.value.message


def test_in_band_error_event_is_relayed_as_an_error(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(inband_error_after_chunks=2, message="sampling failed: NaN in logits"))
    with pytest.raises(openai.APIError) as caught:
        for _ in client.completions.create(model=MODEL, prompt="hi", stream=True):
            pass
    assert "NaN in logits" in caught.value.message


def test_in_band_error_before_the_first_chunk_is_an_http_error(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    upstream.faults.append(Fault(inband_error_after_chunks=0, message="prompt too long"))
    body = {"model": MODEL, "prompt": "hi", "stream": True}
    error = _error(httpx.post(f"{gateway.url}/completions", json=body), 502)
    assert error["message"] == "prompt too long"
    assert error["code"] == "upstream_stream_error"


def test_raw_stream_error_event_then_done(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(drop_after_chunks=2))
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/chat/completions", json=body) as response:
        events = response.read().decode().split("\n\n")
    assert response.status_code == 200
    assert events[-3].startswith('data: {"error":{"message":')
    assert events[-2:] == ["data: [DONE]", ""]


def test_upstream_unreachable_is_502_even_when_marked_down() -> None:
    upstream = UpstreamServer(models=(MODEL,)).start()
    gateway = GatewayServer(create_app(gateway_settings(upstream.url))).start()
    try:
        upstream.stop()  # healthy at start, gone now
        body = {"model": MODEL, "messages": MESSAGES}
        error = _error(httpx.post(f"{gateway.url}/chat/completions", json=body), 502)
        assert error["code"] == "upstream_unreachable"
    finally:
        gateway.stop()
    # A gateway whose only worker is down from the start is not ready, but still tries the worker
    # (panic mode: it may have just come up), so the client learns the upstream is unreachable.
    gateway = GatewayServer(create_app(gateway_settings(upstream.url))).start()
    try:
        assert httpx.get(f"{gateway.base_url}/health/ready").status_code == 503
        error = _error(httpx.post(f"{gateway.url}/chat/completions", json=body), 502)
        assert error["code"] == "upstream_unreachable"
    finally:
        gateway.stop()


def test_retry_moves_to_another_worker_before_the_first_byte(upstream: UpstreamServer) -> None:
    second = UpstreamServer(models=(MODEL,)).start()
    routing = RoutingSettings(policy="round_robin", backoff_base_s=0.01, health_interval_s=30)
    gateway = GatewayServer(create_app(gateway_settings(upstream.url, second.url, routing=routing))).start()
    try:
        with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0) as sdk:
            for fault in (Fault(status=503), Fault(status=429), Fault(drop_after_chunks=0)):
                upstream.faults.append(fault)
                upstream.requests.clear()
                second.requests.clear()
                answered = 0
                # Round robin soon sends a request to the faulty worker first.
                while upstream.faults and answered < 4:
                    stream = sdk.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
                    assert "".join(c.choices[0].delta.content or "" for c in stream) == ANSWER
                    answered += 1
                assert not upstream.faults
                # Every request was answered; the one failed attempt moved to the other worker.
                assert len(upstream.generation_requests()) + len(second.generation_requests()) == answered + 1
    finally:
        gateway.stop()
        second.stop()
