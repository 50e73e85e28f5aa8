"""Two gateway replicas share answers through a real redis-server; when Redis goes, they keep serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.app import create_app
from proxy.cache.settings import CacheSettings
from tests.cachelayer.test_remote import REDIS_SERVER, RedisProcess
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server binary not found")


def ask(gateway: GatewayServer, content: str) -> str:
    with openai.OpenAI(base_url=gateway.url, api_key="k", max_retries=0, timeout=10) as client:
        messages: Any = [{"role": "user", "content": content}]
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, temperature=0)
        raw.parse()
        return str(raw.headers["x-radixgate-cache"])


def test_replicas_share_answers_through_redis_and_survive_its_loss(
    tmp_path: Path, upstream: UpstreamServer
) -> None:
    redis_server = RedisProcess(tmp_path)
    redis_server.start()
    cache = CacheSettings(redis_url=redis_server.url, redis_key_prefix="e2e:")
    replicas = [
        GatewayServer(create_app(gateway_settings(upstream.url, cache=cache))).start() for _ in range(2)
    ]
    try:
        assert ask(replicas[0], "shared") == "miss"
        assert ask(replicas[1], "shared") == "hit"  # stored by the other replica, found in Redis
        assert len(upstream.generation_requests()) == 1
        redis_server.stop()
        assert [ask(replicas[1], "after redis is gone") for _ in range(2)] == ["miss", "hit"]  # its memory
        assert ask(replicas[0], "shared") == "hit"  # its own memory tiers still hold the answer
    finally:
        for replica in replicas:
            replica.stop()
        redis_server.stop()
