"""A test upstream on loopback and a real gateway (uvicorn) in front of it, shared per module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest

from adapters.openai_compat import UpstreamClientConfig
from proxy.app import create_app
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.settings import Settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

MODEL = "test-model"
READ_TIMEOUT_S = 2.0
"""Short, so the upstream-timeout test is quick; long answers in tests stream within it."""


def gateway_settings(*upstream_urls: str, **sections: object) -> Settings:
    """Settings for a gateway in front of `upstream_urls`, each serving MODEL."""
    base: dict[str, object] = {
        "workers": [WorkerSpec(url=url, models=[MODEL]) for url in upstream_urls],
        "routing": RoutingSettings(max_attempts=3, backoff_base_s=0.01, health_interval_s=30),
        "upstream_client": UpstreamClientConfig(read_timeout_s=READ_TIMEOUT_S),
    }
    base.update(sections)
    return Settings(**base)


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[UpstreamServer]:
    server = UpstreamServer(models=(MODEL,)).start()
    yield server
    server.stop()


@pytest.fixture
def upstream(upstream_server: UpstreamServer) -> Iterator[UpstreamServer]:
    """The module's upstream with no pending faults and an empty request log."""
    upstream_server.faults.clear()
    upstream_server.requests.clear()
    yield upstream_server
    upstream_server.faults.clear()


@pytest.fixture(scope="module")
def gateway(upstream_server: UpstreamServer) -> Iterator[GatewayServer]:
    server = GatewayServer(create_app(gateway_settings(upstream_server.url))).start()
    yield server
    server.stop()


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=10) as sdk:
        yield sdk


@pytest.fixture
async def async_client(gateway: GatewayServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=30) as sdk:
        yield sdk
