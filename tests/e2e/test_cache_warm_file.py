"""`[cache] warm_file`: prompts and requests run in the background after start, so the first real
request is a prefix hit; progress in `/v1/cache/stats`. A tiny random 2-layer Llama keeps it short."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from adapters.local import LocalEngineConfig
from proxy.app import create_app
from proxy.cache.settings import CacheSettings
from proxy.config import SettingsError
from proxy.settings import Settings
from tests.adapters.local.tiny_gguf import write_tiny_gguf
from tests.gateway_server import GatewayServer

MODEL = "tiny"
SYSTEM = "you are a helpful assistant for the cat and mat company " * 3
CHAT = [{"role": "system", "content": "be brief " * 10}, {"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LocalEngineConfig:
    root: Path = tmp_path_factory.mktemp("tiny")
    write_tiny_gguf(root / "tiny.gguf")
    return LocalEngineConfig(
        model_path=root / "tiny.gguf", model_id=MODEL, cache_dir=root / "weights", threads=1, max_running=4
    )


@pytest.fixture
def warm_file(tmp_path: Path) -> Path:
    path = tmp_path / "warm.jsonl"
    lines = [
        json.dumps(SYSTEM),
        "",
        json.dumps({"messages": CHAT, "max_tokens": 2, "temperature": 0}),
        "not json",
        json.dumps(42),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def gateway(engine: LocalEngineConfig, warm_file: Path) -> Iterator[GatewayServer]:
    app = create_app(Settings(local_engine=engine, cache=CacheSettings(warm_file=warm_file)))
    server = GatewayServer(app).start()
    yield server
    server.stop()


def warming(server: GatewayServer, within_s: float = 60.0) -> dict[str, Any]:
    """The `warming` section once its run is done."""
    deadline = time.monotonic() + within_s
    while True:
        section: dict[str, Any] = httpx.get(f"{server.url}/cache/stats").json()["warming"]
        if section["state"] == "done" or time.monotonic() > deadline:
            return section
        time.sleep(0.05)


@pytest.mark.slow
def test_the_warm_file_makes_the_first_real_request_a_prefix_hit(gateway: GatewayServer) -> None:
    progress = warming(gateway)
    assert progress["state"] == "done"
    assert (progress["items"], progress["done"], progress["failed"]) == (4, 4, 2)
    assert len(progress["errors"]) == 2 and "line 4" in progress["errors"][0]
    with openai.OpenAI(base_url=gateway.url, api_key="k", max_retries=0, timeout=60) as client:
        first = client.completions.create(model=MODEL, prompt=SYSTEM + "what is a mat?", max_tokens=2)
        chat = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=CHAT, max_tokens=2, temperature=0
        )
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens >= 16 * 4  # the warmed prefix's whole pages
    assert chat.headers["x-radixgate-cache"] == "hit"  # the warmed request's answer was stored
    stats = httpx.get(f"{gateway.url}/cache/stats").json()
    assert stats["overall"]["background_tasks_active"] is False
    assert stats["cache_manager"]["radix_tree"]["prefix_matches"] > 0


def test_a_missing_warm_file_is_a_settings_error(engine: LocalEngineConfig, tmp_path: Path) -> None:
    settings = Settings(local_engine=engine, cache=CacheSettings(warm_file=tmp_path / "absent.jsonl"))
    with pytest.raises(SettingsError, match=r"cache\.warm_file"):
        create_app(settings)


def test_warm_with_an_empty_body_is_a_clear_400(gateway: GatewayServer) -> None:
    for body in (b"", b"{}"):
        response = httpx.post(
            f"{gateway.url}/cache/warm", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "requests" and "`requests`" in error["message"]
