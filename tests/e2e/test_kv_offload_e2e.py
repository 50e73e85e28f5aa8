"""KV offload through the gateway: `cache.dir` (`--cache-dir`) sends the embedded engine's evicted KV
pages to memory and `DIR/kv`; warmed prefixes come back from there, after a restart too, and the
cache endpoints report and clear them. A tiny random 2-layer Llama keeps it to seconds."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from adapters.local import LocalEngine, LocalEngineConfig
from proxy.app import create_app
from proxy.cache.settings import CacheSettings
from proxy.routing.pool import WorkerPool
from proxy.settings import Settings
from tests.adapters.local.tiny_gguf import write_tiny_gguf
from tests.gateway_server import GatewayServer

MODEL = "tiny"
PREFIX = "the cat sat on a mat " * 6  # about 8 pages of the tiny byte-level vocabulary
EVICTORS = [f"{word} " * 12 for word in ("alpha", "bravo", "charlie", "delta")]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    write_tiny_gguf(root / "tiny.gguf")
    return root / "tiny.gguf"


@contextmanager
def gateway(model_file: Path, cache_dir: Path) -> Iterator[GatewayServer]:
    engine = LocalEngineConfig(
        model_path=model_file,
        model_id=MODEL,
        cache_dir=model_file.parent / "weights",
        threads=1,
        kv_budget_tokens=12 * 16,  # 12 pages: the prefix leaves them when other prompts run
        max_running=1,
    )
    app = create_app(Settings(local_engine=engine, cache=CacheSettings(dir=cache_dir)))
    pool = app.state.gateway.router
    assert isinstance(pool, WorkerPool)
    (worker,) = pool.workers()
    assert isinstance(worker.engine, LocalEngine)
    worker.engine.start_sync()
    server = GatewayServer(app).start()
    try:
        yield server
    finally:
        server.stop()  # closes the engine: queued page writes land, the directory is released


def ask(client: openai.OpenAI, prompt: str) -> Any:
    """A sampled request, so the response cache stays out of the way and the engine runs it."""
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=1.0, seed=None)


def kv_cache_stats(server: GatewayServer) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{server.url}/cache/stats").json()["cache_manager"]["kv_cache"]
    return stats


@pytest.mark.slow
def test_warmed_prefix_is_offloaded_reloaded_and_cleared(model_file: Path, tmp_path: Path) -> None:
    with gateway(model_file, tmp_path) as server:
        warmed = httpx.post(
            f"{server.url}/cache/warm", json={"model": MODEL, "prompts": [PREFIX]}, timeout=60
        ).json()
        assert warmed["results"][0]["status"] == "prefilled"
        with openai.OpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=60) as client:
            for prompt in EVICTORS:
                ask(client, prompt)
            answer = ask(client, PREFIX + "and then?")
        assert answer.usage.prompt_tokens_details.cached_tokens >= 6 * 16
        kv = kv_cache_stats(server)
        assert kv["contents"] == "responses+kv_pages"
        (pages,) = kv["kv_pages"]
        assert pages["worker"] == "local" and pages["loaded_pages"] >= 6 and pages["offloaded_pages"] > 0
        tiers = {t["name"]: t for t in kv["tiers"]}
        assert tiers["kv_l2"]["hits"] >= 6 and tiers["kv_l3"]["entries"] > 0
        assert kv["l2_hits"] >= tiers["kv_l2"]["hits"]
        metrics = httpx.get(f"{server.base_url}/metrics").text
        assert 'radixgate_cache_hits_total{tier="kv_l2"}' in metrics
        assert 'radixgate_cache_bytes{tier="kv_l3"}' in metrics
    assert any(path.is_file() for path in (tmp_path / "kv").rglob("*") if path.name != ".lock")

    with gateway(model_file, tmp_path) as server:  # a restart: only the disk tier remains
        with openai.OpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=60) as client:
            answer = ask(client, PREFIX + "and after a restart?")
        assert answer.usage.prompt_tokens_details.cached_tokens >= 6 * 16
        tiers = {t["name"]: t for t in kv_cache_stats(server)["tiers"]}
        assert tiers["kv_l3"]["hits"] >= 6
        cleared = httpx.post(f"{server.url}/cache/clear").json()
        assert cleared["engines"] == [{"worker": "local", "flushed": True}]
        tiers = {t["name"]: t for t in kv_cache_stats(server)["tiers"]}
        assert tiers["kv_l2"]["entries"] == 0 and tiers["kv_l3"]["entries"] == 0
