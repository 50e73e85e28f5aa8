"""A conversation past SmolLM2's 8,192-token context, through the openai SDK and the real gateway:
refused without the sliding window, served with it (`enable_sliding_window` on `/v1/cached/*`),
and the window's figures in `/v1/cache/stats`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.local import LocalEngineConfig
from proxy.app import create_app
from proxy.cache.settings import SlidingWindowSettings
from proxy.settings import Settings
from tests.gateway_server import GatewayServer

pytestmark = pytest.mark.slow

ENGINE = LocalEngineConfig(threads=1, kv_budget_tokens=4096, max_running=2)
WINDOW = SlidingWindowSettings(window_size=256, window_overlap=32, sink_tokens=4)
CONTEXT = 8192


def long_history() -> str:
    """About 9,000 tokens of deterministic text (a ship log), longer than the model's context."""
    return " ".join(
        f"Ship {i} passed the lighthouse at dawn, carrying {i % 7 + 2} crates." for i in range(720)
    )


@pytest.fixture(scope="module")
def served() -> Iterator[GatewayServer]:
    server = GatewayServer(create_app(Settings(local_engine=ENGINE, sliding_window=WINDOW))).start()
    yield server
    server.stop()


def series(server: GatewayServer) -> dict[str, float]:
    """The embedded engine's window series on `/metrics`."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("radixgate_engine_window")
    }


def messages() -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a harbour clerk."},
        {"role": "user", "content": long_history()},
        {"role": "user", "content": "Which building did the ships pass?"},
    ]


def test_past_the_context_refused_without_the_window_served_with_it(served: GatewayServer) -> None:
    server = served
    plain = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=600)
    with plain, pytest.raises(openai.BadRequestError) as refused:
        plain.chat.completions.create(model=ENGINE.model_id, messages=messages(), max_tokens=8)  # type: ignore[arg-type]
    assert refused.value.code == "context_length_exceeded"
    with openai.OpenAI(base_url=f"{server.url}/cached", api_key="unused", max_retries=0, timeout=600) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model=ENGINE.model_id,
            messages=messages(),  # type: ignore[arg-type]
            max_tokens=300,
            temperature=0,
            extra_body={"enable_sliding_window": True},
        )
    answer = raw.parse()
    assert answer.usage is not None and answer.usage.prompt_tokens > CONTEXT
    assert answer.choices[0].message.content
    assert "window_reuse" in raw.http_response.json()["cache_stats"]
    # Decoding ran past the window (256): its pages slid out, and none are held once it finished.
    stats = httpx.get(f"{server.url}/cache/stats", timeout=10).json()["cache_manager"]["sliding_window"]
    assert stats["implemented"] is True and stats["misses"] >= 1
    assert stats["evictions"] > (answer.usage.prompt_tokens - 300) // ENGINE.page_size
    assert stats["configured"]["sink_tokens"] == 4
    # Nothing runs now; the finished turn's kept window waits for the next turn.
    assert series(server)["radixgate_engine_window_kv_pages"] == 0 and stats["memory_bytes"] > 0

    # The next turn continues the history: it takes over the kept window and computes only the new turn.
    follow_up = [
        *messages(),
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": "And how many crates did ship 3 carry?"},
    ]
    with openai.OpenAI(base_url=f"{server.url}/cached", api_key="unused", max_retries=0, timeout=600) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model=ENGINE.model_id,
            messages=follow_up,  # type: ignore[arg-type]
            max_tokens=16,
            temperature=0,
            extra_body={"enable_sliding_window": True},
        )
    second = raw.parse()
    assert raw.http_response.json()["cache_stats"]["window_reuse"] == 1
    details = second.usage.prompt_tokens_details if second.usage is not None else None
    assert details is not None and (details.cached_tokens or 0) > CONTEXT
    stats = httpx.get(f"{server.url}/cache/stats", timeout=10).json()["cache_manager"]["sliding_window"]
    assert stats["hits"] >= 1
    # The same figures as Prometheus series.
    exported = series(server)
    assert exported["radixgate_engine_window_hits_total"] == stats["hits"]
    assert exported["radixgate_engine_window_evicted_pages_total"] == stats["evictions"]
    assert "radixgate_engine_window_utilization_ratio" in exported
