"""Cache-aware routing end to end: the openai SDK -> a real gateway -> simulated SGLang worker processes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.routing_support import MODEL, SimWorker, admin_workers, start_gateway, start_workers, stop_all
from tests.gateway_server import GatewayServer

SYSTEM = "You are the support assistant of a large company. " * 60


@pytest.fixture(scope="module")
def workers() -> Iterator[list[SimWorker]]:
    started = start_workers(3)
    yield started
    stop_all(started)


@pytest.fixture
def gateway(workers: list[SimWorker]) -> Iterator[GatewayServer]:
    server = start_gateway(workers)
    yield server
    server.stop()


def test_requests_sharing_a_prefix_land_on_the_worker_that_cached_it(
    workers: list[SimWorker], gateway: GatewayServer
) -> None:
    before = [w.requests_served() for w in workers]
    with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0) as client:
        cached = []
        for question in range(6):
            answer = client.chat.completions.create(
                model=MODEL,
                max_tokens=4,
                messages=[
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"question {question}"},
                ],
            )
            assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
            cached.append(answer.usage.prompt_tokens_details.cached_tokens)
    served = [w.requests_served() - b for w, b in zip(workers, before, strict=True)]
    assert sorted(served) == [0, 0, 6]  # every request went where the system prompt was cached
    assert cached[0] == 0 and all(c > len(SYSTEM) * 0.9 for c in cached[1:])  # the engine confirms it


def test_unrelated_prompts_are_spread_and_the_admin_api_shows_it(
    workers: list[SimWorker], gateway: GatewayServer
) -> None:
    with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0) as client:
        for topic in range(6):
            client.completions.create(model=MODEL, prompt=f"topic {topic} " * 300, max_tokens=2)
    rows = admin_workers(gateway)
    assert all(row["health"] == "up" and row["circuit"] == "closed" for row in rows.values())
    assert all(row["requests"] >= 1 and row["tree_tokens"] > 0 for row in rows.values())
    # No tokenizer configured: the SGLang workers' own /tokenize was found and is used.
    assert all(row["tokenizers"] == {MODEL: "engine"} for row in rows.values())
    assert all(row["tokenizer_sources"][MODEL].endswith("/tokenize") for row in rows.values())


def test_streaming_through_the_router_keeps_usage_and_deltas(gateway: GatewayServer) -> None:
    with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "stream please"}],
        )
        chunks = list(stream)
        whole = client.chat.completions.create(
            model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "stream please"}]
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 12
    # The engine is deterministic: the deltas add up to the same text as the non-streamed answer.
    assert text == whole.choices[0].message.content and len(text) == 12
    assert httpx.get(gateway.base_url + "/health/ready").status_code == 200
