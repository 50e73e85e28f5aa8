"""OpenAICompatEngine against respx-mocked upstreams: bytes forwarded, errors mapped, streams closed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
import respx

from adapters.base import EngineRequest
from adapters.errors import (
    EngineError,
    EngineOverloaded,
    InBandError,
    UpstreamStatusError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from adapters.openai_compat import OpenAICompatEngine, UpstreamClientConfig, api_root
from adapters.schema import ChatCompletionRequest, ChatMessage

BASE = "http://upstream.test:8000"
# respx intercepts httpx's own transport (httpcore), not `adapters.http_transport.FastTransport`.
RESPX_CLIENT = UpstreamClientConfig(transport="httpx")
CHAT_URL = f"{BASE}/v1/chat/completions"
RAW = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"vendor_field":{"x":[1,2]},"stream":true}'
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m-2025",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 4},
    },
}


def _request(stream: bool = False) -> EngineRequest:
    params = ChatCompletionRequest(
        model="m", messages=[ChatMessage(role="user", content="hi")], stream=stream
    )
    return EngineRequest(
        "chat",
        params,
        RAW,
        "req-1",
        "tenant",
        "salt",
        trace_headers={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
    )


class RecordingStream(httpx.AsyncByteStream):
    """A response body served in the given pieces; remembers whether it was closed."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part

    async def aclose(self) -> None:
        self.closed = True


def _sse(parts: list[bytes]) -> tuple[httpx.Response, RecordingStream]:
    stream = RecordingStream(parts)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream), stream


@pytest.fixture
async def engine() -> AsyncIterator[OpenAICompatEngine]:
    engine = OpenAICompatEngine(BASE, api_key="upstream-key", provider_name="vllm", config=RESPX_CLIENT)
    yield engine
    await engine.aclose()


@pytest.mark.parametrize("url", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"])
def test_api_root_adds_v1_once(url: str) -> None:
    assert api_root(url) == "http://h:1/v1"


def test_engine_names_its_server() -> None:
    engine = OpenAICompatEngine("https://api.example.test/v1", provider_name="openai")
    assert (engine.server_address, engine.server_port, engine.provider_name) == (
        "api.example.test",
        443,
        "openai",
    )


@respx.mock
async def test_complete_forwards_raw_body_and_headers(engine: OpenAICompatEngine) -> None:
    route = respx.post(CHAT_URL).respond(200, json=ANSWER)
    completion = await engine.complete(_request())
    sent = route.calls.last.request
    assert sent.content == RAW
    assert sent.headers["authorization"] == "Bearer upstream-key"
    assert sent.headers["traceparent"].startswith("00-aaaa")
    assert json.loads(completion.body) == ANSWER
    assert completion.response_id == "chatcmpl-1" and completion.response_model == "m-2025"
    assert completion.finish_reasons == ["stop"]
    assert completion.usage is not None and completion.usage.cached_tokens == 4


@respx.mock
async def test_upstream_cookies_are_not_kept(engine: OpenAICompatEngine) -> None:
    route = respx.post(CHAT_URL).respond(200, json=ANSWER, headers={"set-cookie": "session=tenant-a"})
    await engine.complete(_request())
    await engine.complete(_request())
    assert "cookie" not in route.calls.last.request.headers


@respx.mock
@pytest.mark.parametrize(
    ("status", "body", "expected_status", "message", "param", "code"),
    [
        (
            400,
            {
                "error": {
                    "message": "bad temp",
                    "type": "invalid_request_error",
                    "param": "temperature",
                    "code": "x",
                }
            },
            400,
            "bad temp",
            "temperature",
            "x",
        ),
        (
            400,
            {"object": "error", "message": "too long", "type": "BadRequestError", "param": None, "code": 400},
            400,
            "too long",
            None,
            None,
        ),
        (422, {"detail": "field required"}, 422, "field required", None, None),
        (
            500,
            {"error": {"message": "CUDA out of memory", "type": "InternalServerError"}},
            502,
            "CUDA out of memory",
            None,
            None,
        ),
    ],
)
async def test_status_errors_keep_the_upstream_message(
    engine: OpenAICompatEngine,
    status: int,
    body: object,
    expected_status: int,
    message: str,
    param: str | None,
    code: str | None,
) -> None:
    respx.post(CHAT_URL).respond(status, json=body)
    with pytest.raises(UpstreamStatusError) as caught:
        await engine.complete(_request())
    assert (caught.value.status, caught.value.message, caught.value.param, caught.value.code) == (
        expected_status,
        message,
        param,
        code,
    )
    assert caught.value.retryable is (status >= 500)


@respx.mock
async def test_non_json_error_body_and_429(engine: OpenAICompatEngine) -> None:
    respx.post(CHAT_URL).respond(429, text="<html>slow down</html>")
    with pytest.raises(UpstreamStatusError) as caught:
        await engine.complete(_request())
    assert caught.value.status == 429 and caught.value.retryable
    assert "slow down" in caught.value.message


@respx.mock
@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (httpx.ConnectError("refused"), UpstreamUnreachable),
        (httpx.ConnectTimeout("slow connect"), UpstreamUnreachable),
        (httpx.ReadTimeout("slow"), UpstreamTimeout),
        (httpx.PoolTimeout("busy"), EngineOverloaded),
        (httpx.RemoteProtocolError("peer closed"), UpstreamUnreachable),
    ],
)
async def test_transport_errors_are_mapped(
    engine: OpenAICompatEngine, error: Exception, expected: type
) -> None:
    respx.post(CHAT_URL).mock(side_effect=error)
    with pytest.raises(expected) as caught:
        await engine.complete(_request())
    assert caught.value.retryable


@respx.mock
async def test_stream_yields_payloads_until_done(engine: OpenAICompatEngine) -> None:
    response, body = _sse(
        [
            b'data: {"id":"c1","choices":[]}\n',
            b"\n: ping\n\ndata:",
            b'{"id":"c2"}\r\n\r\n',
            b"data: [DONE]\n\n",
        ]
    )
    respx.post(CHAT_URL).mock(return_value=response)
    chunks = [chunk async for chunk in engine.stream(_request(stream=True))]
    assert chunks == [b'{"id":"c1","choices":[]}', b'{"id":"c2"}']
    assert body.closed


@respx.mock
async def test_closing_the_stream_early_closes_the_response(engine: OpenAICompatEngine) -> None:
    response, body = _sse([b'data: {"id":"c1"}\n\n', b'data: {"id":"c2"}\n\n', b"data: [DONE]\n\n"])
    respx.post(CHAT_URL).mock(return_value=response)
    stream = engine.stream(_request(stream=True))
    assert await stream.__anext__() == b'{"id":"c1"}'
    await stream.aclose()
    assert body.closed


@respx.mock
@pytest.mark.parametrize(
    "error_event",
    [
        b'data: {"error": {"message": "NaN in logits", "type": "BadRequestError", "code": 400}}\n\n',
        b'data: {"error": "NaN in logits"}\n\n',
        b"event: error\ndata: NaN in logits\n\n",
    ],
)
async def test_in_band_error_raises_after_earlier_chunks(
    engine: OpenAICompatEngine, error_event: bytes
) -> None:
    response, body = _sse(
        [b'data: {"id":"c1","choices":[{"delta":{"content":"\\"error\\""}}]}\n\n', error_event]
    )
    respx.post(CHAT_URL).mock(return_value=response)
    received: list[bytes] = []
    with pytest.raises(InBandError) as caught:
        async for chunk in engine.stream(_request(stream=True)):
            received.append(chunk)
    assert len(received) == 1
    assert caught.value.message == "NaN in logits"
    assert body.closed


@respx.mock
async def test_stream_status_error_before_the_first_chunk(engine: OpenAICompatEngine) -> None:
    respx.post(CHAT_URL).respond(503, json={"error": {"message": "overloaded"}})
    with pytest.raises(UpstreamStatusError) as caught:
        await engine.stream(_request(stream=True)).__anext__()
    assert caught.value.status == 502 and caught.value.message == "overloaded"


@respx.mock
async def test_stream_answered_with_json_is_an_error(engine: OpenAICompatEngine) -> None:
    respx.post(CHAT_URL).respond(200, json={"error": {"message": "stream not supported"}})
    with pytest.raises(InBandError, match="stream not supported"):
        await engine.stream(_request(stream=True)).__anext__()
    respx.post(CHAT_URL).respond(200, json=ANSWER)
    with pytest.raises(EngineError, match="application/json"):
        await engine.stream(_request(stream=True)).__anext__()


@respx.mock
async def test_health_and_model_listing(engine: OpenAICompatEngine) -> None:
    respx.get(f"{BASE}/v1/models").respond(200, json={"object": "list", "data": [{"id": "a"}, {"id": "b"}]})
    assert await engine.list_models() == ["a", "b"]
    assert await engine.check_health()
    respx.get(f"{BASE}/v1/models").respond(503, json={"detail": "loading"})
    assert not await engine.check_health()
    respx.get(f"{BASE}/v1/models").mock(side_effect=httpx.ConnectError("refused"))
    assert not await engine.check_health()
