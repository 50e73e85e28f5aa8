"""Two gateway replicas on one real redis-server enforce one limit per tenant: requests, in-flight
requests and token budgets are counted once across both; without Redis each replica goes on alone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.cache.settings import CacheSettings
from proxy.settings import ApiKeySettings, AuthSettings
from proxy.tenancy import TenantLimits
from tests.cachelayer.test_remote import REDIS_SERVER, RedisProcess
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import Fault, UpstreamServer

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server binary not found")

KEYS = {"acme": "sk-acme", "hooli": "sk-hooli", "initech": "sk-initech"}
LIMITS = {
    "acme": TenantLimits(requests_per_minute=3),
    "hooli": TenantLimits(max_concurrent_requests=1),
    "initech": TenantLimits(token_budget=20, budget_period="day"),
}


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def replicas(upstream_server: UpstreamServer, redis_server: RedisProcess) -> Iterator[list[GatewayServer]]:
    auth = AuthSettings(
        api_keys=[ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()], tenants=LIMITS
    )
    cache = CacheSettings(redis_url=redis_server.url, redis_key_prefix="limits-e2e:")
    servers = [
        GatewayServer(create_app(gateway_settings(upstream_server.url, auth=auth, cache=cache))).start()
        for _ in range(2)
    ]
    yield servers
    for server in servers:
        server.stop()


def sdk(gateway: GatewayServer, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=KEYS[tenant], max_retries=0, timeout=10)


def ask(gateway: GatewayServer, tenant: str) -> bool:
    """True when answered, False on a 429."""
    with sdk(gateway, tenant) as client:
        try:
            client.completions.create(model=MODEL, prompt="hello there", max_tokens=4, temperature=0.5)
        except openai.RateLimitError:
            return False
    return True


def test_two_replicas_count_one_request_rate(replicas: list[GatewayServer], upstream: UpstreamServer) -> None:
    answered = [ask(replicas[n % 2], "acme") for n in range(5)]
    assert answered == [True, True, True, False, False]  # 3 per minute across both, not 3 each
    assert len(upstream.generation_requests()) == 3


async def test_one_in_flight_request_across_replicas(
    replicas: list[GatewayServer], upstream: UpstreamServer
) -> None:
    upstream.faults.append(Fault(delay_s=1.0))
    clients = [
        openai.AsyncOpenAI(base_url=r.url, api_key=KEYS["hooli"], max_retries=0, timeout=10) for r in replicas
    ]
    slow = asyncio.create_task(clients[0].completions.create(model=MODEL, prompt="slow", max_tokens=4))
    await asyncio.sleep(0.3)
    with pytest.raises(openai.RateLimitError):
        await clients[1].completions.create(model=MODEL, prompt="second", max_tokens=4)
    assert (await slow).choices[0].text
    await asyncio.sleep(0.2)  # the first replica's settle reaches Redis
    assert (await clients[1].completions.create(model=MODEL, prompt="third", max_tokens=4)).choices[0].text
    for client in clients:
        await client.close()


def test_a_budget_spent_on_one_replica_is_spent_on_both(replicas: list[GatewayServer]) -> None:
    spent = 0
    while ask(replicas[spent % 2], "initech"):
        spent += 1
        assert spent < 20
    assert spent >= 1 and not ask(replicas[0], "initech") and not ask(replicas[1], "initech")


def test_without_redis_each_replica_goes_on_alone(
    replicas: list[GatewayServer], redis_server: RedisProcess
) -> None:
    redis_server.stop()
    assert [ask(replicas[0], "acme") for _ in range(4)] == [True, True, True, False]
    assert ask(replicas[1], "acme")  # its own bucket
