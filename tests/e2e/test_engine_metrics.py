"""The embedded engine's series on `/metrics` (running and waiting sequences, KV usage, preemptions,
evicted tokens, prefix-hit tokens, queue time, inter-token latency) all move under load: concurrent
streams through the real gateway into an engine with a small KV pool and room for two sequences."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.local import LocalEngineConfig
from proxy.app import create_app
from proxy.cache.settings import CacheSettings
from proxy.settings import Settings
from tests.deploy.artifacts import every_named_metric
from tests.gateway_server import GatewayServer

pytestmark = pytest.mark.slow

# Two sequences of ~90 tokens do not fit in 7 pages of 16: the engine preempts and evicts. Without
# speculation: the burst's repeats of the first prompt would draft its cached answer from the radix
# tree and finish in a few steps, before the pool runs out.
ENGINE = LocalEngineConfig(threads=1, kv_budget_tokens=112, max_running=2, max_queued=32, speculative=False)
PROMPT = "List the planets of the solar system, one per line, with a short note on each."
WORKER = "local"
MAX_TOKENS = 32
BURST = 4


def samples(gateway: GatewayServer) -> dict[tuple[str, str], float]:
    """(sample name, le) -> value, for the embedded worker's engine series."""
    text = httpx.get(f"{gateway.base_url}/metrics", timeout=5).text
    return {
        (sample.name, sample.labels.get("le", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("radixgate_engine_") and sample.labels.get("worker") == WORKER
    }


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayServer]:
    # No response cache: every request reaches the engine, repeated prompts hit its prefix cache.
    settings = Settings(local_engine=ENGINE, cache=CacheSettings(response_cache=False))
    server = GatewayServer(create_app(settings)).start()
    yield server
    server.stop()


def test_every_engine_series_moves_under_load(gateway: GatewayServer) -> None:
    peaks: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:  # the gauges are instantaneous: keep their peaks while the load runs
        while not done.is_set():
            for (name, _), value in samples(gateway).items():
                if name in {
                    "radixgate_engine_running_sequences",
                    "radixgate_engine_waiting_sequences",
                    "radixgate_engine_kv_usage_ratio",
                }:
                    peaks[name] = max(peaks.get(name, 0.0), value)
            done.wait(0.02)

    async def load() -> None:
        async with openai.AsyncOpenAI(
            base_url=gateway.url, api_key="unused", max_retries=0, timeout=120
        ) as sdk:

            async def one(i: int) -> None:
                stream = await sdk.chat.completions.create(
                    model=ENGINE.model_id,
                    messages=[{"role": "user", "content": f"{PROMPT} ({i % 2})"}],
                    max_tokens=MAX_TOKENS,
                    temperature=0,
                    stream=True,
                )
                async for _ in stream:
                    pass

            await one(0)  # caches the prompt's pages: the burst's first request hits them
            await asyncio.gather(*(one(i) for i in range(BURST)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        asyncio.run(load())
    finally:
        done.set()
        watcher.join(5)
    after = samples(gateway)
    assert peaks["radixgate_engine_running_sequences"] >= 1
    assert peaks["radixgate_engine_waiting_sequences"] >= 1
    assert 0 < peaks["radixgate_engine_kv_usage_ratio"] <= 1
    for counter in ("preemptions", "evicted_tokens", "prefix_hit_tokens", "prefix_query_tokens"):
        assert after[(f"radixgate_engine_{counter}_total", "")] > 0, counter
    assert after[("radixgate_engine_queue_time_seconds_count", "")] == 1 + BURST
    assert after[("radixgate_engine_queue_time_seconds_sum", "")] > 0
    # 1 + BURST streams of MAX_TOKENS tokens: one gap fewer each, unless one stopped early.
    gaps = after[("radixgate_engine_inter_token_latency_seconds_count", "")]
    assert 1 + BURST <= gaps <= (1 + BURST) * (MAX_TOKENS - 1)
    assert (
        after[("radixgate_engine_inter_token_latency_seconds_bucket", "+Inf")]
        == after[("radixgate_engine_inter_token_latency_seconds_count", "")]
    )


def test_the_dashboards_name_only_engine_series_the_gateway_exports(gateway: GatewayServer) -> None:
    exported = {name for name, _ in samples(gateway)}
    named = {name for name in every_named_metric() if name.startswith("radixgate_engine_")}
    assert len(named) >= 8
    assert named <= exported
