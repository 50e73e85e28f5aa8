"""Contract tests of the SGLang adapter against SGLang's documented wire formats (respx)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import msgspec
import pytest
import respx

from adapters.base import EngineRequest
from adapters.errors import EngineOverloaded, InBandError
from adapters.openai_compat import UpstreamClientConfig
from adapters.schema import ChatCompletionRequest, ChatMessage, CompletionRequest, StreamOptions
from adapters.sglang import SGLangEngine

BASE = "http://sglang.test:30000"
# respx intercepts httpx's own transport (httpcore), not `adapters.http_transport.FastTransport`.
RESPX_CLIENT = UpstreamClientConfig(transport="httpx")


def chat(
    *, tokens: list[int] | None = None, stream: bool = False, salt: str = "salt-1", **extra: object
) -> EngineRequest:
    params = ChatCompletionRequest(
        model="qwen",
        messages=[ChatMessage(role="user", content="hi")],
        max_tokens=8,
        stream=stream,
        stream_options=StreamOptions(include_usage=True) if stream else None,
        **extra,  # type: ignore[arg-type]
    )
    raw = msgspec.json.encode(params)
    return EngineRequest(
        operation="chat",
        params=params,
        raw_body=raw,
        request_id="req-1",
        tenant_id="t",
        cache_salt=salt,
        prompt_token_ids=tokens,
    )


def sse(*events: object) -> bytes:
    return b"".join(
        b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events
    )


@pytest.fixture
async def engine() -> AsyncIterator[SGLangEngine]:
    engine = SGLangEngine(BASE, config=RESPX_CLIENT)
    yield engine
    await engine.aclose()


@respx.mock
async def test_openai_endpoint_gets_the_body_with_the_gateways_cache_salt(engine: SGLangEngine) -> None:
    route = respx.post(f"{BASE}/v1/chat/completions").respond(
        json={
            "id": "c1",
            "object": "chat.completion",
            "model": "qwen",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": 5,
                "completion_tokens": 1,
                "total_tokens": 6,
                "prompt_tokens_details": {"cached_tokens": 3},
            },
        }
    )
    request = chat()
    request.raw_body = request.raw_body[:-1] + b',"cache_salt":"forged","custom_field":1}'
    completion = await engine.complete(request)
    sent = json.loads(route.calls[0].request.content)
    assert sent["cache_salt"] == "salt-1" and sent["custom_field"] == 1
    assert completion.usage is not None and completion.usage.cached_tokens == 3


@respx.mock
async def test_native_generate_with_input_ids_and_meta_info_usage(engine: SGLangEngine) -> None:
    route = respx.post(f"{BASE}/generate").respond(
        json={
            "text": "hello there",
            "output_ids": [5, 6],
            "meta_info": {
                "id": "x",
                "finish_reason": {"type": "length", "length": 2},
                "prompt_tokens": 4,
                "completion_tokens": 2,
                "cached_tokens": 3,
                "e2e_latency": 0.1,
            },
        }
    )
    completion = await engine.complete(chat(tokens=[1, 2, 3, 4]))
    sent = json.loads(route.calls[0].request.content)
    assert sent["input_ids"] == [1, 2, 3, 4] and sent["extra_key"] == "salt-1"
    assert sent["sampling_params"]["max_new_tokens"] == 8 and sent["stream"] is False
    body = json.loads(completion.body)
    assert body["object"] == "chat.completion"
    assert body["choices"][0] == {
        "index": 0,
        "finish_reason": "length",
        "logprobs": None,
        "message": {"role": "assistant", "content": "hello there"},
    }
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    assert completion.finish_reasons == ["length"]


@respx.mock
async def test_cumulative_streamed_text_becomes_deltas(engine: SGLangEngine) -> None:
    meta = {"id": "x", "prompt_tokens": 4, "completion_tokens": 1, "cached_tokens": 0}
    respx.post(f"{BASE}/generate").respond(
        headers={"content-type": "text/event-stream"},
        content=sse(
            {"text": "Hel", "meta_info": {**meta, "finish_reason": None}},
            {"text": "Hello wor", "meta_info": {**meta, "finish_reason": None}},
            {
                "text": "Hello world",
                "meta_info": {
                    **meta,
                    "completion_tokens": 3,
                    "finish_reason": {"type": "stop", "matched": 2},
                },
            },
            b"[DONE]",
        ),
    )
    chunks = [json.loads(c) async for c in engine.stream(chat(tokens=[1, 2, 3, 4], stream=True))]
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]]
    assert deltas == ["Hel", "lo wor", "ld"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert len({c["id"] for c in chunks}) == 1


@respx.mock
async def test_an_in_band_error_event_raises_mid_stream(engine: SGLangEngine) -> None:
    respx.post(f"{BASE}/generate").respond(
        headers={"content-type": "text/event-stream"},
        content=sse(
            {"text": "He", "meta_info": {"finish_reason": None}},
            {"error": {"message": "CUDA out of memory", "code": 500}},
        ),
    )
    stream = engine.stream(chat(tokens=[1], stream=True))
    first = json.loads(await stream.__anext__())
    assert first["choices"][0]["delta"]["content"] == "He"
    with pytest.raises(InBandError, match="out of memory"):
        await stream.__anext__()


@respx.mock
async def test_an_abort_finish_reason_is_an_error_not_an_empty_success(engine: SGLangEngine) -> None:
    respx.post(f"{BASE}/generate").respond(
        headers={"content-type": "text/event-stream"},
        content=sse(
            {
                "text": "",
                "output_ids": [],
                "meta_info": {
                    "id": "x",
                    "finish_reason": {
                        "type": "abort",
                        "status_code": 503,
                        "message": "Request waiting timeout reached.",
                    },
                },
            },
            b"[DONE]",
        ),
    )
    with pytest.raises(EngineOverloaded, match="waiting timeout") as caught:
        await engine.stream(chat(tokens=[1], stream=True)).__anext__()
    assert caught.value.retryable


@respx.mock
async def test_requests_needing_the_openai_api_do_not_use_generate(engine: SGLangEngine) -> None:
    route = respx.post(f"{BASE}/v1/chat/completions").respond(json={"id": "c", "choices": []})
    await engine.complete(chat(tokens=[1, 2], n=2))
    await engine.complete(chat(tokens=[1, 2], tools=[{"type": "function", "function": {"name": "f"}}]))
    assert route.call_count == 2


@respx.mock
async def test_in_band_error_on_the_openai_stream(engine: SGLangEngine) -> None:
    respx.post(f"{BASE}/v1/chat/completions").respond(
        headers={"content-type": "text/event-stream"},
        content=sse(
            {
                "error": {
                    "object": "error",
                    "message": "Request waiting timeout reached.",
                    "type": "SERVICE_UNAVAILABLE",
                    "param": None,
                    "code": 503,
                }
            },
            b"[DONE]",
        ),
    )
    with pytest.raises(InBandError, match="waiting timeout"):
        await engine.stream(chat(stream=True)).__anext__()


@respx.mock
async def test_flush_cache_answers_false_while_busy(engine: SGLangEngine) -> None:
    route = respx.post(f"{BASE}/flush_cache")
    route.side_effect = [
        httpx.Response(400, text="Cache not flushed. Please check if the server is idle."),
        httpx.Response(200, text="Cache flushed."),
    ]
    assert await engine.flush_cache() is False
    assert await engine.flush_cache() is True


@respx.mock
async def test_capacity_from_server_info_or_the_older_get_server_info(engine: SGLangEngine) -> None:
    respx.get(f"{BASE}/server_info").respond(404, json={"detail": "Not Found"})
    respx.get(f"{BASE}/get_server_info").respond(
        json={"max_total_num_tokens": 20480, "internal_states": [{}]}
    )
    assert await engine.kv_capacity_tokens() == 20480


@respx.mock
async def test_capacity_inside_internal_states(engine: SGLangEngine) -> None:
    respx.get(f"{BASE}/server_info").respond(json={"internal_states": [{"max_total_num_tokens": 777}]})
    assert await engine.kv_capacity_tokens() == 777


@pytest.mark.parametrize("prefix", ["sglang:", "sglang_"])
@respx.mock
async def test_metrics_under_both_prefixes(engine: SGLangEngine, prefix: str) -> None:
    respx.get(f"{BASE}/metrics").respond(
        text=(
            f"# HELP {prefix}num_running_reqs The number of running requests.\n"
            f"# TYPE {prefix}num_running_reqs gauge\n"
            f'{prefix}num_running_reqs{{model_name="qwen",engine_type="unified"}} 7.0\n'
            f'{prefix}num_queue_reqs{{model_name="qwen"}} 2.0\n'
            f'{prefix}token_usage{{model_name="qwen"}} 0.25\n'
            f'{prefix}cache_hit_rate{{model_name="qwen"}} 0.5\n'
        )
    )
    load = await engine.load()
    assert (load.running, load.waiting, load.kv_usage, load.cache_hit_rate) == (7.0, 2.0, 0.25, 0.5)


@respx.mock
async def test_health_uses_health_generate(engine: SGLangEngine) -> None:
    route = respx.get(f"{BASE}/health_generate")
    route.side_effect = [httpx.Response(200), httpx.Response(503)]
    assert await engine.check_health() is True
    assert await engine.check_health() is False


@respx.mock
async def test_tokenize(engine: SGLangEngine) -> None:
    route = respx.post(f"{BASE}/tokenize").respond(
        json={"tokens": [9, 8, 7], "count": 3, "max_model_len": 4096}
    )
    assert await engine.tokenize("abc") == [9, 8, 7]
    assert json.loads(route.calls[0].request.content)["prompt"] == "abc"


@respx.mock
async def test_text_completion_through_generate(engine: SGLangEngine) -> None:
    respx.post(f"{BASE}/generate").respond(
        json={
            "text": " Paris",
            "meta_info": {"finish_reason": {"type": "stop"}, "prompt_tokens": 5, "completion_tokens": 1},
        }
    )
    params = CompletionRequest(model="qwen", prompt="The capital of France is", max_tokens=4)
    request = EngineRequest(
        operation="text_completion",
        params=params,
        raw_body=msgspec.json.encode(params),
        request_id="r",
        tenant_id="t",
        cache_salt="",
        prompt_token_ids=[1, 2, 3, 4, 5],
    )
    completion = await engine.complete(request)
    body = json.loads(completion.body)
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == " Paris"
    # SGLang did not report cached tokens: unknown, not zero.
    assert completion.usage is not None and completion.usage.cached_tokens is None


@respx.mock
async def test_tokenizer_path_from_server_info(engine: SGLangEngine) -> None:
    respx.get(f"{BASE}/server_info").respond(
        json={"model_path": "/models/llama", "tokenizer_path": "/models/llama-tok"}
    )
    assert await engine.tokenizer_path() == "/models/llama-tok"


@respx.mock
async def test_tokenizer_path_falls_back_to_the_model_path(engine: SGLangEngine) -> None:
    respx.get(f"{BASE}/server_info").respond(json={"model_path": "/models/llama"})
    assert await engine.tokenizer_path() == "/models/llama"


@respx.mock
async def test_kv_events_advert_from_the_server_args(engine: SGLangEngine) -> None:
    config = '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'
    route = respx.get(f"{BASE}/server_info")
    route.respond(json={"kv_events_config": config, "dp_size": 1})
    advert = await engine.kv_events_advert()
    assert advert is not None and (advert.endpoint, advert.replay_endpoint) == (
        "tcp://*:5557",
        "tcp://*:5558",
    )
    # Events off (no config, or the null publisher), and data-parallel attention ranks.
    route.respond(json={"kv_events_config": None})
    assert await engine.kv_events_advert() is None
    route.respond(json={"kv_events_config": '{"publisher": "null"}'})
    assert await engine.kv_events_advert() is None
    route.respond(json={"kv_events_config": config, "dp_size": 4, "enable_dp_attention": True})
    advert = await engine.kv_events_advert()
    assert advert is not None and advert.ranks == (0, 1, 2, 3)
