"""Speculative decoding through the gateway, in front of the embedded engine (a tiny random 2-layer
Llama, whose greedy answers repeat themselves, so prompt lookup drafts and is accepted): the real
openai SDK on `/v1/cached/completions` and `/v1/completions`, the per-request `enable_speculation`,
the answer's `cache_stats.speculation_hits`, `/v1/cache/stats` and `/metrics`."""

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

pytestmark = pytest.mark.slow

MODEL = "tiny"
PROMPT = "one two three four " * 8


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    root: Path = tmp_path_factory.mktemp("tiny")
    write_tiny_gguf(root / "tiny.gguf")
    engine = LocalEngineConfig(
        model_path=root / "tiny.gguf",
        model_id=MODEL,
        cache_dir=root / "weights",
        threads=1,
        kv_budget_tokens=4096,
        max_running=4,
        speculative=False,  # off by default here: each request below says what it wants
    )
    app = create_app(Settings(local_engine=engine))
    pool = app.state.gateway.router
    assert isinstance(pool, WorkerPool)
    (worker,) = pool.workers()
    assert isinstance(worker.engine, LocalEngine)
    worker.engine.start_sync()
    server = GatewayServer(app).start()
    yield server
    server.stop()


def cached(client: openai.OpenAI, **extras: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 48, "temperature": 0, "enable_caching": False}
    answer: dict[str, Any] = client.post("/cached/completions", body={**body, **extras}, cast_to=object)
    return answer


def test_enable_speculation_per_request_changes_no_token(gateway: GatewayServer) -> None:
    with openai.OpenAI(base_url=gateway.url, api_key="k", max_retries=0, timeout=60) as client:
        plain = cached(client)  # the engine's default here: off
        spec = cached(client, enable_speculation=True)
        off = cached(client, enable_speculation=False)
        sdk = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=0)
    assert spec["choices"][0]["text"] == plain["choices"][0]["text"] == off["choices"][0]["text"]
    hits = spec["cache_stats"]["speculation_hits"]
    assert (
        hits > 0 and plain["cache_stats"]["speculation_hits"] == off["cache_stats"]["speculation_hits"] == 0
    )
    details = spec["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] == hits
    assert "completion_tokens_details" not in plain["usage"]
    # /v1/completions takes the engine's default (off here): no drafts.
    assert sdk.choices[0].text == plain["choices"][0]["text"] and sdk.usage is not None
    assert sdk.usage.completion_tokens_details is None

    stats = httpx.get(f"{gateway.url}/cache/stats").json()["cache_manager"]["speculation"]
    assert stats["implemented"] is True
    assert stats["hits"] == hits and stats["misses"] == details["rejected_prediction_tokens"]
    assert stats["hit_rate"] == round(100 * hits / (hits + stats["misses"]), 2)
    assert stats["tokens_generated"] >= hits + stats["verify_steps"]
    assert stats["avg_depth"] == round(hits / stats["verify_steps"], 3)
    by_source = {s["source"]: s for s in stats["sources"]}
    assert by_source["prompt"]["accepted_tokens"] + by_source["radix"]["accepted_tokens"] == hits
    metrics = httpx.get(f"{gateway.base_url}/metrics").text
    accepted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("radixgate_engine_speculative_accepted_tokens_total{")
    )
    assert accepted == hits
    assert 'radixgate_engine_speculative_verify_steps_total{worker="local"}' in metrics


def test_enable_speculation_must_be_a_boolean(gateway: GatewayServer) -> None:
    reply = httpx.post(
        f"{gateway.url}/cached/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 2, "enable_speculation": "yes"},
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "enable_speculation"


def test_beam_search_through_the_sdk(gateway: GatewayServer) -> None:
    """vLLM's extension shape: `use_beam_search` with `n` beams (capped by `[speculative] beam_width`,
    2 in the development preset), on both endpoints; the choices come back best first."""
    with openai.OpenAI(base_url=gateway.url, api_key="k", max_retries=0, timeout=60) as client:
        beams = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, n=2, extra_body={"use_beam_search": True}
        )
        again = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, n=2, extra_body={"use_beam_search": True}
        )
        chat = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=8,
            n=1,
            extra_body={"use_beam_search": True, "length_penalty": 0.0, "early_stopping": True},
        )
        greedy = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=8, temperature=0
        )
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(
                model=MODEL, prompt="x", max_tokens=2, n=3, extra_body={"use_beam_search": True}
            )
    assert [c.index for c in beams.choices] == [0, 1]
    assert [c.text for c in beams.choices] == [c.text for c in again.choices]
    assert chat.choices[0].message.content == greedy.choices[0].message.content  # width 1 is greedy
    assert refused.value.status_code == 400 and "beam_width" in refused.value.message
    stats = httpx.get(f"{gateway.url}/cache/stats").json()["cache_manager"]["speculation"]
    assert stats["beam_searches"] >= 3 and stats["early_stops"] >= stats["beam_early_stops"]
