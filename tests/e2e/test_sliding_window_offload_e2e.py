"""Window reuse across a gateway restart, through the openai SDK: a windowed chat's kept window goes
to the embedded engine's L3 directory at shutdown, and the restarted gateway's next turn of the
conversation loads it back (`cache_stats.window_reuse`, `sliding_window.hits`)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from adapters.local import LocalEngineConfig
from proxy.app import create_app
from proxy.cache.settings import SlidingWindowSettings
from proxy.settings import Settings
from tests.gateway_server import GatewayServer

pytestmark = pytest.mark.slow

WINDOW = SlidingWindowSettings(window_size=128, window_overlap=32, sink_tokens=4)


def chat(
    server: GatewayServer, messages: list[dict[str, str]], max_tokens: int
) -> tuple[str, dict[str, int]]:
    """One windowed turn on `/v1/cached`: its answer and its `cache_stats`."""
    with openai.OpenAI(base_url=f"{server.url}/cached", api_key="unused", max_retries=0, timeout=300) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model="smollm2-135m-instruct",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"enable_sliding_window": True},
        )
    content = raw.parse().choices[0].message.content
    assert content
    return content, raw.http_response.json()["cache_stats"]


def test_a_kept_window_survives_a_gateway_restart(tmp_path: Path) -> None:
    engine = LocalEngineConfig(threads=1, kv_budget_tokens=2048, kv_offload=True, kv_offload_dir=tmp_path)
    settings = Settings(local_engine=engine, sliding_window=WINDOW)
    history = " ".join(f"Crate {i} went to pier {i % 5}." for i in range(40))
    question = "Which pier got crate 7?"
    first_turn = [{"role": "user", "content": history}, {"role": "user", "content": question}]
    server = GatewayServer(create_app(settings)).start()
    try:
        answer, _ = chat(server, first_turn, 40)
    finally:
        server.stop()  # the engine writes its kept windows to L3 as it shuts down
    assert any(tmp_path.iterdir())

    follow_up = [*first_turn, {"role": "assistant", "content": answer}, {"role": "user", "content": "And 9?"}]
    restarted = GatewayServer(create_app(settings)).start()
    try:
        _, cache_stats = chat(restarted, follow_up, 8)
        reply = httpx.get(f"{restarted.url}/cache/stats", timeout=10).json()
        stats = reply["cache_manager"]["sliding_window"]
        metrics = httpx.get(f"{restarted.base_url}/metrics", timeout=10).text
    finally:
        restarted.stop()
    assert cache_stats["window_reuse"] == 1
    assert stats["hits"] == 1 and stats["offload_hits"] == 1
    assert "radixgate_engine_window_offload_hits_total{" in metrics
