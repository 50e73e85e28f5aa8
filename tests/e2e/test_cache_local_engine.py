"""The cache in front of the embedded engine (a tiny random 2-layer Llama, so it runs in seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from adapters.local import LocalEngine, LocalEngineConfig
from proxy.app import create_app
from proxy.routing.pool import WorkerPool
from proxy.settings import Settings
from tests.adapters.local.tiny_gguf import write_tiny_gguf
from tests.gateway_server import GatewayServer

MODEL = "tiny"
PREFIX = "the " * 40  # a few pages of shared prompt


@pytest.fixture(scope="module")
def local_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    root: Path = tmp_path_factory.mktemp("tiny")
    write_tiny_gguf(root / "tiny.gguf")
    engine = LocalEngineConfig(
        model_path=root / "tiny.gguf",
        model_id=MODEL,
        cache_dir=root / "weights",
        threads=1,
        kv_budget_tokens=4096,
        max_running=4,
    )
    app = create_app(Settings(local_engine=engine))
    pool = app.state.gateway.router
    assert isinstance(pool, WorkerPool)
    (worker,) = pool.workers()
    assert isinstance(worker.engine, LocalEngine)
    worker.engine.start_sync()  # load the weights before the first health check
    server = GatewayServer(app).start()
    yield server
    server.stop()


def complete(client: openai.OpenAI, prompt: str, **options: Any) -> tuple[str, Any]:
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=4, **options)
    return raw.headers["x-radixgate-cache"], raw.parse()


@pytest.mark.slow
def test_local_engine_answers_are_cached_and_its_radix_cache_is_reported(
    local_gateway: GatewayServer,
) -> None:
    with openai.OpenAI(base_url=local_gateway.url, api_key="k", max_retries=0, timeout=60) as client:
        first = complete(client, PREFIX + "one", temperature=0)
        second = complete(client, PREFIX + "one", temperature=0)
        shared = complete(client, PREFIX + "two", temperature=0)
    assert (first[0], second[0], shared[0]) == ("miss", "hit", "miss")
    assert second[1].choices[0].text == first[1].choices[0].text
    assert shared[1].usage.prompt_tokens_details.cached_tokens > 0  # the engine reused the prefix pages
    radix = httpx.get(f"{local_gateway.url}/cache/stats").json()["cache_manager"]["radix_tree"]
    (engine,) = radix["engines"]
    assert engine["worker"] == "local"
    assert engine["hit_tokens"] >= shared[1].usage.prompt_tokens_details.cached_tokens
    assert engine["query_tokens"] >= first[1].usage.prompt_tokens + shared[1].usage.prompt_tokens
    assert engine["cached_tokens"] > 0 and engine["nodes"] > 0
    # One engine and no routing tree: the headline figures are the engine's own.
    assert radix["workers"][0]["tree_tokens"] == 0
    assert radix["prefix_matches"] == radix["sharing_hits"] == engine["hit_tokens"] > 0
    assert radix["active_prefixes"] == engine["nodes"]
    assert radix["memory_saved"] == engine["reused_kv_bytes"] > 0
    assert radix["avg_prefix_length"] > 0
    metrics = httpx.get(f"{local_gateway.base_url}/metrics").text
    assert 'radixgate_cache_radix_tree_tokens{tree="engine",worker="local"}' in metrics
