"""A cross-tenant probe through every place the gateway keeps a prefix or an answer: the response
cache's L1/L2 memory, its L3 disk and its Redis tier, `/v1/cached/*` with a `cache_key`, and the
embedded engine's KV pages, in its pool and offloaded to memory and disk. Tenant B asks exactly what
tenant A asked; B never gets A's answer or A's prefix, while A's own repeat does (so each probe would
see a leak). Routing trees are probed in `tests/proxy/routing/test_cache_aware.py`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from adapters.local import LocalEngineConfig
from proxy.app import create_app
from proxy.auth import hash_key
from proxy.cache.settings import CacheSettings
from proxy.settings import ApiKeySettings, AuthSettings, Settings
from tests.adapters.local.tiny_gguf import write_tiny_gguf
from tests.cachelayer.test_remote import REDIS_SERVER, RedisProcess
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

KEYS = {"alice": "sk-alice", "bob": "sk-bob"}
AUTH = AuthSettings(api_keys=[ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()])
QUESTION: Any = [{"role": "user", "content": "What did alice ask?"}]


def outcome(gateway: GatewayServer, tenant: str, path: str = "/chat/completions", **extra: Any) -> str:
    """`x-radixgate-cache` of a deterministic request, as `tenant`."""
    body = {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 8, **extra}
    response = httpx.post(
        gateway.url + path, json=body, headers={"authorization": f"Bearer {KEYS[tenant]}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    return response.headers["x-radixgate-cache"]


def test_response_cache_tiers_never_answer_another_tenant(
    upstream_server: UpstreamServer, tmp_path: Path
) -> None:
    redis: RedisProcess | None = None
    cache = CacheSettings(dir=tmp_path / "cache")
    if REDIS_SERVER is not None:
        redis = RedisProcess(tmp_path)
        redis.start()
        cache = CacheSettings(dir=tmp_path / "cache", redis_url=redis.url, redis_key_prefix="xt:")
    try:
        gateway = GatewayServer(
            create_app(gateway_settings(upstream_server.url, auth=AUTH, cache=cache))
        ).start()
        try:
            assert outcome(gateway, "alice") == "miss"
            assert outcome(gateway, "alice") == "hit"  # L1: the probe sees a hit
            assert outcome(gateway, "alice", max_tokens=7) == "miss"  # only alice ever asks this one
            assert outcome(gateway, "bob") == "miss"  # L1: never alice's answer
            assert outcome(gateway, "bob", "/cached/chat/completions", cache_key="k") == "miss"
            assert outcome(gateway, "alice", "/cached/chat/completions", cache_key="k") == "miss"
            assert outcome(gateway, "alice", "/cached/chat/completions", cache_key="k") == "hit"
            assert outcome(gateway, "bob", "/cached/chat/completions", cache_key="k") == "hit"  # bob's own
        finally:
            gateway.stop()
        # A new process: memory is empty, so answers come from L3 (and Redis) or not at all.
        if redis is not None:
            no_disk = CacheSettings(redis_url=redis.url, redis_key_prefix="xt:")
            replica = GatewayServer(
                create_app(gateway_settings(upstream_server.url, auth=AUTH, cache=no_disk))
            ).start()
            try:
                assert outcome(replica, "alice") == "hit"  # from Redis
                assert outcome(replica, "bob") == "hit"  # bob's own answer, stored above
            finally:
                replica.stop()
        restarted = GatewayServer(
            create_app(gateway_settings(upstream_server.url, auth=AUTH, cache=cache))
        ).start()
        try:
            assert outcome(restarted, "bob", max_tokens=7) == "miss"  # alice's entry is on disk, not bob's
            assert outcome(restarted, "alice", max_tokens=7) == "hit"  # from L3: the entry is there
        finally:
            restarted.stop()
    finally:
        if redis is not None:
            redis.stop()


TINY = "tiny"
PREFIX = "the cat sat on a mat " * 6  # about 8 pages of the tiny byte-level vocabulary
EVICTORS = [f"{word} " * 12 for word in ("alpha", "bravo", "charlie", "delta")]


@pytest.fixture
def tiny_engine_gateway(tmp_path: Path) -> Iterator[GatewayServer]:
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model)
    engine = LocalEngineConfig(
        model_path=model,
        model_id=TINY,
        cache_dir=tmp_path / "weights",
        threads=1,
        kv_budget_tokens=12 * 16,  # 12 pages: a prefix leaves them when other prompts run
        max_running=1,
    )
    settings = Settings(local_engine=engine, auth=AUTH, cache=CacheSettings(dir=tmp_path / "cache"))
    server = GatewayServer(create_app(settings)).start()
    yield server
    server.stop()


def cached_tokens(gateway: GatewayServer, tenant: str, prompt: str) -> int:
    with openai.OpenAI(base_url=gateway.url, api_key=KEYS[tenant], max_retries=0, timeout=60) as client:
        answer = client.completions.create(model=TINY, prompt=prompt, max_tokens=2, temperature=1.0)
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    return answer.usage.prompt_tokens_details.cached_tokens or 0


@pytest.mark.slow
def test_engine_kv_pages_never_serve_another_tenant(tiny_engine_gateway: GatewayServer) -> None:
    gateway = tiny_engine_gateway
    assert cached_tokens(gateway, "alice", PREFIX + "one") == 0
    assert cached_tokens(gateway, "bob", PREFIX + "two") == 0  # alice's pages sit in the pool
    assert cached_tokens(gateway, "alice", PREFIX + "three") >= 6 * 16  # the probe sees her own
    for prompt in EVICTORS:  # both prefixes leave the pool for the offload tiers
        cached_tokens(gateway, "alice", prompt)
    tiers = httpx.get(
        gateway.url + "/cache/stats", headers={"authorization": f"Bearer {KEYS['alice']}"}
    ).json()
    (pages,) = tiers["cache_manager"]["kv_cache"]["kv_pages"]
    assert pages["offloaded_pages"] > 0
    assert cached_tokens(gateway, "bob", PREFIX + "four") >= 6 * 16  # bob's own, reloaded
    for prompt in EVICTORS:
        cached_tokens(gateway, "bob", prompt)
    assert cached_tokens(gateway, "alice", PREFIX + "five") >= 6 * 16  # hers, reloaded: not bob's
