"""Contract tests of the vLLM adapter against vLLM's documented wire formats (respx)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import msgspec
import pytest
import respx

from adapters.base import EngineRequest
from adapters.errors import InBandError
from adapters.openai_compat import UpstreamClientConfig
from adapters.schema import ChatCompletionRequest, ChatMessage
from adapters.vllm import VLLMEngine

BASE = "http://vllm.test:8000"
# respx intercepts httpx's own transport (httpcore), not `adapters.http_transport.FastTransport`.
RESPX_CLIENT = UpstreamClientConfig(transport="httpx")


def chat(*, stream: bool = False, salt: str = "tenant-salt") -> EngineRequest:
    params = ChatCompletionRequest(
        model="llama", messages=[ChatMessage(role="user", content="hi")], stream=stream
    )
    return EngineRequest(
        operation="chat",
        params=params,
        raw_body=msgspec.json.encode(params),
        request_id="r",
        tenant_id="t",
        cache_salt=salt,
    )


def answer(usage: dict[str, object]) -> dict[str, object]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "llama",
        "usage": usage,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hey"}, "finish_reason": "stop"}
        ],
    }


@pytest.fixture
async def engine() -> AsyncIterator[VLLMEngine]:
    engine = VLLMEngine(BASE + "/v1", config=RESPX_CLIENT)
    yield engine
    await engine.aclose()


@respx.mock
async def test_cache_salt_is_forwarded(engine: VLLMEngine) -> None:
    route = respx.post(f"{BASE}/v1/chat/completions").respond(json=answer({"prompt_tokens": 3}))
    await engine.complete(chat())
    assert json.loads(route.calls[0].request.content)["cache_salt"] == "tenant-salt"
    await engine.complete(chat(salt=""))
    assert "cache_salt" not in json.loads(route.calls[1].request.content)


@respx.mock
async def test_missing_cached_tokens_is_unknown_not_zero(engine: VLLMEngine) -> None:
    respx.post(f"{BASE}/v1/chat/completions").respond(
        json=answer(
            {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11, "prompt_tokens_details": None}
        )
    )
    completion = await engine.complete(chat())
    assert completion.usage is not None and completion.usage.cached_tokens is None


@respx.mock
async def test_reported_cached_tokens_are_kept(engine: VLLMEngine) -> None:
    respx.post(f"{BASE}/v1/chat/completions").respond(
        json=answer(
            {
                "prompt_tokens": 10,
                "completion_tokens": 1,
                "total_tokens": 11,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
        )
    )
    completion = await engine.complete(chat())
    assert completion.usage is not None and completion.usage.cached_tokens == 0


@respx.mock
async def test_in_band_stream_error(engine: VLLMEngine) -> None:
    respx.post(f"{BASE}/v1/chat/completions").respond(
        headers={"content-type": "text/event-stream"},
        content=b'data: {"error": {"object": "error", "message": "engine dead", '
        b'"type": "InternalServerError", "param": null, "code": 500}}\n\ndata: [DONE]\n\n',
    )
    with pytest.raises(InBandError, match="engine dead"):
        await engine.stream(chat(stream=True)).__anext__()


@respx.mock
async def test_tokenize(engine: VLLMEngine) -> None:
    route = respx.post(f"{BASE}/tokenize").respond(
        json={"count": 2, "max_model_len": 8192, "tokens": [128000, 9906], "token_strs": None}
    )
    assert await engine.tokenize("Hello") == [128000, 9906]
    assert json.loads(route.calls[0].request.content) == {"prompt": "Hello", "add_special_tokens": False}


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 250.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2048"} 1.0
"""


@respx.mock
async def test_metrics_load_and_capacity(engine: VLLMEngine) -> None:
    respx.get(f"{BASE}/metrics").respond(text=METRICS)
    load = await engine.load()
    assert (load.running, load.waiting, load.kv_usage, load.cache_hit_rate) == (3.0, 1.0, 0.42, 0.25)
    assert await engine.kv_capacity_tokens() == 2048 * 16


@respx.mock
async def test_reset_prefix_cache_and_health(engine: VLLMEngine) -> None:
    reset = respx.post(f"{BASE}/reset_prefix_cache").respond(200)
    respx.get(f"{BASE}/health").respond(200)
    assert await engine.flush_cache() is True and reset.call_count == 1
    assert await engine.check_health() is True


@respx.mock
async def test_tokenizer_path_is_the_models_root(engine: VLLMEngine) -> None:
    respx.get(f"{BASE}/v1/models").respond(
        json={"object": "list", "data": [{"id": "llama", "object": "model", "root": "/models/llama-3-8b"}]}
    )
    assert await engine.tokenizer_path() == "/models/llama-3-8b"


@respx.mock
async def test_kv_events_advert_from_the_dev_mode_server_info(engine: VLLMEngine) -> None:
    route = respx.get(f"{BASE}/server_info", params={"config_format": "json"})
    events = {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557", "topic": "kv"}
    route.respond(json={"vllm_config": {"kv_events_config": events}})
    advert = await engine.kv_events_advert()  # no publisher named: vLLM's default for enabled events, zmq
    assert advert is not None and (advert.endpoint, advert.replay_endpoint, advert.topic) == (
        "tcp://*:5557",
        None,
        "kv",
    )
    route.respond(json={"vllm_config": {"kv_events_config": {**events, "enable_kv_cache_events": False}}})
    assert await engine.kv_events_advert() is None
    route.respond(json={"vllm_config": "VllmConfig(model='llama', ...)"})  # the text format
    assert await engine.kv_events_advert() is None
    route.respond(404, json={"detail": "Not Found"})  # not in dev mode
    assert await engine.kv_events_advert() is None
