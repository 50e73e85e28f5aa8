"""The seed's cached endpoints and cache management endpoints, called with the openai SDK and httpx."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from proxy.app import create_app
from proxy.routing.config import WorkerSpec
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import CACHED_TOKENS, UpstreamServer

MESSAGES: Any = [{"role": "user", "content": "Explain quantum computing"}]
EXTRAS = ("enable_caching", "enable_speculation", "enable_sliding_window", "cache_key", "request_id")


@pytest.fixture(scope="module")
def cache_gateway(upstream_server: UpstreamServer) -> Iterator[GatewayServer]:
    # Two workers (one upstream, listed twice): a model one worker serves is routed without a tree,
    # and the stats test reads the routing trees.
    server = GatewayServer(create_app(gateway_settings(upstream_server.url, upstream_server.url))).start()
    yield server
    server.stop()


@pytest.fixture
def gateway(cache_gateway: GatewayServer, upstream: UpstreamServer) -> GatewayServer:
    httpx.post(f"{cache_gateway.url}/cache/clear")
    upstream.requests.clear()
    return cache_gateway


@pytest.fixture
def cached(gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    """An SDK whose base URL points at `/v1/cached`, so `chat.completions.create` calls the cached route."""
    with openai.OpenAI(base_url=f"{gateway.url}/cached", api_key="k", max_retries=0, timeout=10) as client:
        yield client


def test_client_post_reaches_the_cached_chat_endpoint(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 100,
        "temperature": 0.7,
        "stream": False,
        "enable_caching": True,
        "enable_speculation": True,
        "enable_sliding_window": False,
        "cache_key": "quantum-explanation",
        "request_id": "req-123",
    }
    with openai.OpenAI(base_url=gateway.url, api_key="k", max_retries=0) as client:
        first = client.post("/cached/chat/completions", body=body, cast_to=ChatCompletion)
        second = client.post(
            "/cached/chat/completions", body={**body, "request_id": "req-124"}, cast_to=ChatCompletion
        )
    extras = first.model_extra or {}
    assert extras["request_id"] == "req-123"
    stats = extras["cache_stats"]
    assert set(stats) == {
        "cache_used",
        "hit_rate",
        "cache_hits",
        "cache_misses",
        "speculation_hits",
        "prefix_matches",
        "window_reuse",
    }
    assert stats["cache_used"] is True  # not from the response cache: the upstream reports cached tokens
    assert (stats["prefix_matches"], stats["speculation_hits"], stats["window_reuse"]) == (1, 0, 0)
    assert stats["cache_misses"] >= 1
    performance = extras["performance"]
    assert set(performance) == {
        "total_time_ms",
        "cache_time_ms",
        "inference_time_ms",
        "tokens_per_second",
        "memory_usage_bytes",
    }
    assert performance["total_time_ms"] >= performance["inference_time_ms"] > 0
    assert first.usage is not None and (first.usage.model_extra or {})["cached_tokens"] == CACHED_TOKENS
    # The sampled request was opted in by its cache_key: the second call is a hit.
    again = second.model_extra or {}
    assert again["request_id"] == "req-124"
    assert again["cache_stats"]["cache_hits"] == stats["cache_hits"] + 1
    assert again["cache_stats"]["hit_rate"] > stats["hit_rate"]
    assert (again["cache_stats"]["cache_used"], again["cache_stats"]["prefix_matches"]) == (True, 0)
    assert again["performance"]["inference_time_ms"] == 0.0
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert (
        (second.usage.model_extra or {})["cached_tokens"]
        == second.usage.prompt_tokens_details.cached_tokens
        == second.usage.prompt_tokens
    )
    assert second.choices[0].message.content == first.choices[0].message.content
    (received,) = upstream.generation_requests()
    assert not set(EXTRAS) & set(received.json), "extras must not reach the upstream"


def test_base_url_trick_with_extra_body(cached: openai.OpenAI, upstream: UpstreamServer) -> None:
    outcomes = []
    for _ in range(2):
        raw = cached.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, temperature=0, extra_body={"cache_key": "k1"}
        )
        outcomes.append(raw.headers["x-radixgate-cache"])
        reply = raw.parse()
        assert reply.choices[0].message.content == "Hello from the test upstream."
        assert "cache_stats" in (reply.model_extra or {})
    assert outcomes == ["miss", "hit"]
    assert len(upstream.generation_requests()) == 1


def test_speculation_takes_the_sections_sampling_for_what_a_request_leaves_out(
    cached: openai.OpenAI, upstream: UpstreamServer
) -> None:
    """`enable_speculation: true` fills temperature/top_k/top_p from `[speculative]` (the seed's
    preset: 0.8, 40, 0.9) where the request sets none; a set value is kept; without it nothing is added."""
    cached.chat.completions.create(
        model=MODEL, messages=MESSAGES, top_p=0.5, extra_body={"enable_speculation": True}
    )
    cached.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"enable_speculation": False})
    speculating, plain = (request.json for request in upstream.generation_requests())
    assert (speculating["temperature"], speculating["top_k"], speculating["top_p"]) == (0.8, 40, 0.5)
    assert not {"temperature", "top_k", "top_p", "enable_speculation"} & set(plain)


def test_cached_text_completions(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    with openai.OpenAI(base_url=gateway.url, api_key="k", max_retries=0) as client:
        body = {"model": MODEL, "prompt": "The weather today is", "max_tokens": 3, "temperature": 0}
        replies = [client.post("/cached/completions", body=body, cast_to=Completion) for _ in range(2)]
    assert replies[0].choices[0].text == replies[1].choices[0].text == "Hello from the"
    hits = [(r.model_extra or {})["cache_stats"]["cache_hits"] for r in replies]
    assert hits[1] == hits[0] + 1
    assert len(upstream.generation_requests()) == 1


def test_a_cached_stream_ends_with_one_extras_chunk(cached: openai.OpenAI) -> None:
    plain = list(cached.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, stream=True))
    replay = list(cached.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, stream=True))
    hits = []
    for chunks in (plain, replay):
        *answer, extras_chunk = chunks
        assert extras_chunk.choices == [] and extras_chunk.id == answer[0].id
        extras = extras_chunk.model_extra or {}
        hits.append(extras["cache_stats"]["cache_hits"])
        assert extras["request_id"] and extras["performance"]["total_time_ms"] > 0
        assert "".join(c.choices[0].delta.content or "" for c in answer) == "Hello from the test upstream."
    assert hits[1] == hits[0] + 1
    assert [c.model_dump() for c in plain[:-1]] == [c.model_dump() for c in replay[:-1]]


def test_enable_caching_false_and_unlabelled_sampled_requests_bypass(
    cached: openai.OpenAI, upstream: UpstreamServer
) -> None:
    def outcome(**options: Any) -> str:
        raw = cached.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, **options)
        return str(raw.headers["x-radixgate-cache"])

    assert [outcome(temperature=0, extra_body={"enable_caching": False}) for _ in range(2)] == ["bypass"] * 2
    assert [outcome(temperature=0.8) for _ in range(2)] == ["bypass"] * 2
    labelled = [outcome(temperature=0.8, extra_body={"cache_key": key}) for key in ("a", "a", "b")]
    assert labelled == ["miss", "hit", "miss"]


def test_a_bad_extra_is_a_400_naming_it(gateway: GatewayServer) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/cached", api_key="k", max_retries=0)
    with client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"enable_caching": "yes"})
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "enable_caching"


def test_stats_come_from_live_counters(gateway: GatewayServer, cached: openai.OpenAI) -> None:
    for _ in range(3):
        cached.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0)
    cached.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0.5)
    before = httpx.get(f"{gateway.url}/cache/stats").json()
    cached.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0)
    stats = httpx.get(f"{gateway.url}/cache/stats").json()
    kv = stats["cache_manager"]["kv_cache"]
    assert kv["l1_hits"] == before["cache_manager"]["kv_cache"]["l1_hits"] + 1
    assert kv["hits"] == kv["l1_hits"] + kv["l2_hits"] + kv["l3_hits"] + kv["remote_hits"]
    assert [t["name"] for t in kv["tiers"]] == ["l1", "l2"]
    assert kv["memory_bytes"] > 0 and kv["disk_bytes"] == 0
    responses = stats["cache_manager"]["response_cache"]
    assert responses["hits"] - before["cache_manager"]["response_cache"]["hits"] == 1
    assert responses["bypasses"] >= 1 and responses["stores"] >= 1
    radix = stats["cache_manager"]["radix_tree"]
    assert radix["implemented"] is True and radix["tree_tokens"] > 0 and radix["memory_saved"] is None
    assert radix["sharing_hits"] == sum(w["reported_cached_tokens"] for w in radix["workers"]) > 0
    speculation = stats["cache_manager"]["speculation"]
    assert speculation["implemented"] is False and speculation["hits"] == 0 and speculation["configured"]
    # Upstream workers only here: no engine reports a window, so every window figure is zero.
    window = stats["cache_manager"]["sliding_window"]
    assert window["implemented"] is True and window["hits"] == window["evictions"] == 0
    assert window["configured"]["window_size"] == 256 and window["configured"]["enabled"] is False
    assert stats["cache_manager"]["speculation"]["configured"]["beam_width"] == 2  # development preset
    overall = stats["overall"]
    assert 0 < overall["hit_rate"] < 100 and overall["total_memory_bytes"] > 0
    assert "efficiency_score" not in overall and overall["background_tasks_active"] is False
    assert stats["alerts"] == []
    assert stats["trends"]["data_points"] == len(stats["trends"]["samples"]) >= 1


def test_clear_empties_the_response_cache_and_routing_trees(
    gateway: GatewayServer, cached: openai.OpenAI, upstream: UpstreamServer
) -> None:
    cached.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0)
    cleared = httpx.post(f"{gateway.url}/cache/clear").json()
    assert {t["tier"]: t["entries"] for t in cleared["response_cache"]} == {"l1": 1, "l2": 1}
    assert cleared["routing_trees_cleared"] == 2  # one per worker
    assert [e["flushed"] for e in cleared["engines"]] == [None, None]  # a plain OpenAI upstream cannot flush
    stats = httpx.get(f"{gateway.url}/cache/stats").json()
    assert stats["cache_manager"]["radix_tree"]["tree_tokens"] == 0
    raw = cached.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, temperature=0)
    assert raw.headers["x-radixgate-cache"] == "miss"
    assert len(upstream.generation_requests()) == 2


def test_warm_runs_requests_and_fills_the_response_cache(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    deterministic = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 5}
    warm = {
        "requests": [
            deterministic,
            {**deterministic, "temperature": 0.7},
            {**deterministic, "model": "nope"},
        ],
        "model": MODEL,
        "prompts": ["a shared system prompt"],
    }
    result = httpx.post(f"{gateway.url}/cache/warm", json=warm).json()
    assert [item["status"] for item in result["results"]] == ["stored", "prefilled", "error", "prefilled"]
    assert result["results"][2]["error"]["code"] == "model_not_found"
    assert (result["warmed"], result["failed"]) == (3, 1)
    (prefill,) = [r.json for r in upstream.generation_requests() if "prompt" in r.json]
    assert (prefill["prompt"], prefill["max_tokens"], prefill["temperature"]) == (
        "a shared system prompt",
        1,
        0,
    )
    sent = len(upstream.generation_requests())
    with openai.OpenAI(base_url=gateway.url, api_key="k", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(**deterministic)
    assert raw.headers["x-radixgate-cache"] == "hit"
    assert len(upstream.generation_requests()) == sent
    again = httpx.post(f"{gateway.url}/cache/warm", json={"requests": [deterministic]}).json()
    assert again["results"][0]["status"] == "already_cached"


def test_warm_prompts_without_a_model_take_the_one_served(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    response = httpx.post(f"{gateway.url}/cache/warm", json={"prompts": ["x"]})
    assert response.status_code == 200
    assert upstream.generation_requests()[-1].json["model"] == MODEL


def test_warm_refuses_prompts_without_a_model_when_several_are_served(
    upstream_server: UpstreamServer,
) -> None:
    settings = gateway_settings(upstream_server.url)
    workers = [*settings.workers, WorkerSpec(url=upstream_server.url, models=["another-model"], id="second")]
    server = GatewayServer(create_app(msgspec.structs.replace(settings, workers=workers))).start()
    try:
        response = httpx.post(f"{server.url}/cache/warm", json={"prompts": ["x"]})
    finally:
        server.stop()
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "model"


def test_prometheus_series_per_tier(gateway: GatewayServer, cached: openai.OpenAI) -> None:
    for _ in range(2):
        cached.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0)
    text = httpx.get(f"{gateway.base_url}/metrics").text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(samples['radixgate_cache_queries_total{tier="l1"}']) >= 2
    assert float(samples['radixgate_cache_hits_total{tier="l1"}']) >= 1
    assert 'radixgate_cache_evictions_total{tier="l2"}' in samples
    assert float(samples['radixgate_cache_bytes{tier="l1"}']) > 0
    assert float(samples['radixgate_cache_entries{tier="l1"}']) == 1
    assert float(samples['radixgate_response_cache_requests_total{outcome="hit"}']) >= 1
    assert any(name.startswith("radixgate_cache_radix_tree_tokens{") for name in samples)
