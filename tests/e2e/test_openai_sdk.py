"""The real openai SDK, sync and async, through the real gateway to an OpenAI-compatible upstream."""

from __future__ import annotations

import json

import httpx
import openai

from tests.e2e.conftest import MODEL
from tests.gateway_server import GatewayServer
from tests.upstream_server import CACHED_TOKENS, UpstreamServer

ANSWER = "Hello from the test upstream."
MESSAGES = [{"role": "user", "content": "Say hello"}]


def _recording_sdk(gateway: GatewayServer, sent: list[bytes]) -> openai.OpenAI:
    """An SDK client that keeps every request body it sends, to compare with what the upstream saw."""
    hook = {"request": [lambda request: sent.append(request.read())]}
    return openai.OpenAI(
        base_url=gateway.url, api_key="unused", max_retries=0, http_client=httpx.Client(event_hooks=hook)
    )


def test_chat_completion(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert response.choices[0].message.content == ANSWER
    assert response.choices[0].finish_reason == "stop"
    assert response.id.startswith("chatcmpl-")
    assert response.usage is not None and response.usage.completion_tokens == 6
    assert response.usage.prompt_tokens_details is not None
    assert response.usage.prompt_tokens_details.cached_tokens == CACHED_TOKENS
    assert upstream.generation_requests()[0].path == "/v1/chat/completions"


def test_text_completion(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    response = client.completions.create(model=MODEL, prompt="Say hello", max_tokens=2)
    assert response.choices[0].text == "Hello from"
    assert response.choices[0].finish_reason == "length"
    assert upstream.generation_requests()[0].path == "/v1/completions"


async def test_chat_stream_with_usage(async_client: openai.AsyncOpenAI, upstream: UpstreamServer) -> None:
    stream = await async_client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert len({chunk.id for chunk in chunks}) == 1
    assert len({chunk.created for chunk in chunks}) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    *body, last = chunks
    assert all(chunk.usage is None for chunk in body)
    assert last.choices == [] and last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + 6


async def test_text_completion_stream(async_client: openai.AsyncOpenAI, upstream: UpstreamServer) -> None:
    stream = await async_client.completions.create(model=MODEL, prompt="Say hello", stream=True)
    chunks = [chunk async for chunk in stream]
    assert "".join(chunk.choices[0].text for chunk in chunks) == ANSWER
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_two_choices(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
    assert [choice.index for choice in response.choices] == [0, 1]
    assert all(choice.message.content == ANSWER for choice in response.choices)

    texts = {0: "", 1: ""}
    for chunk in client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {0: ANSWER, 1: ANSWER}


def test_unknown_fields_and_tools_reach_the_upstream_byte_identical(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    sent: list[bytes] = []
    with _recording_sdk(gateway, sent) as sdk:
        response = sdk.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=tools,
            tool_choice="auto",
            seed=7,
            stop=["\n\n"],
            max_completion_tokens=50,
            logprobs=True,
            top_logprobs=2,
            response_format={"type": "text"},
            extra_body={
                "vendor_extension": {"nested": [1, 2.5, None, "ü"]},
                "chat_template_kwargs": {"x": True},
            },
        )
    call = response.choices[0].message.tool_calls
    assert call is not None and call[0].function.name == "get_weather"
    assert json.loads(call[0].function.arguments) == {"city": "Paris"}
    received = upstream.generation_requests()[0]
    assert received.body == sent[0]
    assert received.json["vendor_extension"] == {"nested": [1, 2.5, None, "ü"]}


def test_streamed_tool_call_deltas_and_structured_fields_pass_through(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    sent: list[bytes] = []
    with _recording_sdk(gateway, sent) as sdk:
        stream = sdk.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": schema, "strict": True},
            },
            logprobs=True,
            top_logprobs=3,
            max_completion_tokens=50,  # else the gateway writes its default cap in (test_request_bounds)
            stream=True,
        )
        chunks = list(stream)
    assert upstream.generation_requests()[0].body == sent[0]
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert (
        calls[0].id == "call_1" and calls[0].function is not None and calls[0].function.name == "get_weather"
    )
    assert "".join((c.function.arguments or "") for c in calls if c.function) == '{"city": "Paris"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]


def test_stream_unknown_fields_pass_through(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    sent: list[bytes] = []
    with _recording_sdk(gateway, sent) as sdk:
        stream = sdk.completions.create(
            model=MODEL,
            prompt=[1, 2, 3],
            max_tokens=16,  # without one, the gateway writes its default cap in (test_request_bounds)
            stream=True,
            extra_body={"min_tokens": 3, "ignore_eos": True},
        )
        assert "".join(chunk.choices[0].text for chunk in stream) == ANSWER
    assert upstream.generation_requests()[0].body == sent[0]


def test_sse_framing_is_exactly_openai(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/chat/completions", json=body) as response:
        raw = response.read().decode()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-request-id"]
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(event.removeprefix("data: ")) for event in events[:-2]]
    assert all(event.startswith("data: {") for event in events[:-2])
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_models_are_listed(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL]
    assert models.data[0].object == "model"


def test_request_id_is_kept(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    body = {"model": MODEL, "messages": MESSAGES}
    response = httpx.post(f"{gateway.url}/chat/completions", json=body, headers={"x-request-id": "req-123"})
    assert response.headers["x-request-id"] == "req-123"


def test_health_endpoints(gateway: GatewayServer) -> None:
    health = httpx.get(f"{gateway.base_url}/health").json()
    assert health["status"] == "healthy"
    assert set(health) == {"status", "timestamp", "version", "uptime_seconds", "details"}
    assert health["timestamp"].endswith("Z")
    assert health["details"]["memory_usage_bytes"] > 10_000_000
    assert health["details"]["active_requests"] == 0
    components = health["details"]["components"]
    assert list(components)[:3] == ["inference_runtime", "model_registry", "cache_system"]
    assert set(components.values()) == {"operational"} and len(components) == 4  # and the one worker
    ready = httpx.get(f"{gateway.base_url}/health/ready")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "models": {MODEL: True}}
    assert httpx.get(f"{gateway.base_url}/health/live").json() == {"status": "alive"}
    metrics = httpx.get(f"{gateway.base_url}/metrics")
    assert metrics.status_code == 200 and "radixgate_" in metrics.text
