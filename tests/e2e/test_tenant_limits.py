"""Per-tenant limits through the real gateway and the openai SDK: what a limited tenant sees (429 with
OpenAI's headers, 404 for a model it may not use), and that other tenants are untouched."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.settings import ApiKeySettings, AuthSettings
from proxy.tenancy import TenantLimits
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import Fault, UpstreamServer

KEYS = {"acme": "sk-acme", "globex": "sk-globex", "initech": "sk-initech", "hooli": "sk-hooli"}
LIMITS = {
    "acme": TenantLimits(requests_per_minute=2),
    "initech": TenantLimits(models=["another-model"]),
    "hooli": TenantLimits(max_concurrent_requests=1),
}


@pytest.fixture(scope="module")
def limited_gateway(upstream_server: UpstreamServer) -> Iterator[GatewayServer]:
    auth = AuthSettings(
        api_keys=[ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()], tenants=LIMITS
    )
    server = GatewayServer(create_app(gateway_settings(upstream_server.url, auth=auth))).start()
    yield server
    server.stop()


def sdk(gateway: GatewayServer, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=KEYS[tenant], max_retries=0, timeout=10)


def ask(client: openai.OpenAI) -> openai.types.Completion:
    return client.completions.create(model=MODEL, prompt="hi", max_tokens=4)


def test_over_the_request_rate_is_a_429_the_sdk_understands(
    limited_gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    with sdk(limited_gateway, "acme") as acme, sdk(limited_gateway, "globex") as globex:
        raw = acme.completions.with_raw_response.create(model=MODEL, prompt="hi", max_tokens=4)
        assert raw.headers["x-ratelimit-limit-requests"] == "2"
        assert raw.headers["x-ratelimit-remaining-requests"] == "1"
        assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
        ask(acme)
        with pytest.raises(openai.RateLimitError) as limited:
            ask(acme)
        assert limited.value.code == "rate_limit_exceeded"
        assert int(limited.value.response.headers["retry-after"]) >= 1
        for _ in range(3):  # another tenant is not limited by acme's traffic
            assert ask(globex).choices[0].text
    assert len(upstream.generation_requests()) == 2 + 3  # the refused request reached no engine


def test_a_model_outside_the_allow_list_does_not_exist(limited_gateway: GatewayServer) -> None:
    with sdk(limited_gateway, "initech") as initech, pytest.raises(openai.NotFoundError) as missing:
        ask(initech)
    assert missing.value.code == "model_not_found"


async def test_one_request_too_many_in_flight_is_refused_at_once(
    limited_gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    upstream.faults.append(Fault(delay_s=1.0))
    async with openai.AsyncOpenAI(
        base_url=limited_gateway.url, api_key=KEYS["hooli"], max_retries=0, timeout=10
    ) as hooli:
        slow = asyncio.create_task(hooli.completions.create(model=MODEL, prompt="slow", max_tokens=4))
        await asyncio.sleep(0.3)
        with pytest.raises(openai.RateLimitError):
            await hooli.completions.create(model=MODEL, prompt="second", max_tokens=4)
        assert (await slow).choices[0].text
        # the slot is free again once the first answer is out
        assert (await hooli.completions.create(model=MODEL, prompt="third", max_tokens=4)).choices[0].text
