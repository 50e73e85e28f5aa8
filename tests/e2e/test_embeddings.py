"""`POST /v1/embeddings` through the gateway to test upstreams that serve an embedding model, by the
openai SDK: pass-through in both encodings, models listed from the workers, the response cache per
tenant, least-load routing, and refusals."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.settings import ApiKeySettings, AuthSettings, Settings
from tests.gateway_server import GatewayServer
from tests.upstream_endpoints import embedding_of
from tests.upstream_server import UpstreamServer

EMBEDDER = "test-embedder"
KEYS = {"alice": "sk-alice", "bob": "sk-bob"}
AUTH = AuthSettings(api_keys=[ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()])


@pytest.fixture(scope="module")
def upstreams() -> Iterator[list[UpstreamServer]]:
    servers = [UpstreamServer(models=(EMBEDDER,)).start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def gateway(upstreams: list[UpstreamServer]) -> Iterator[GatewayServer]:
    # No models configured: the gateway learns them from each worker's /v1/models.
    settings = Settings(
        workers=[WorkerSpec(url=u.url) for u in upstreams],
        routing=RoutingSettings(health_interval_s=30),
        auth=AUTH,
    )
    server = GatewayServer(create_app(settings)).start()
    yield server
    server.stop()


@pytest.fixture
def sent(upstreams: list[UpstreamServer]) -> Iterator[list[UpstreamServer]]:
    for upstream in upstreams:
        upstream.requests.clear()
    yield upstreams


def sdk(gateway: GatewayServer, tenant: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=KEYS[tenant], max_retries=0, timeout=10)


def embedding_requests(upstreams: list[UpstreamServer]) -> int:
    return sum(r.path == "/v1/embeddings" for u in upstreams for r in u.requests)


def test_models_are_listed_from_the_workers(gateway: GatewayServer) -> None:
    assert EMBEDDER in [m.id for m in sdk(gateway).models.list()]


def test_float_and_base64_vectors_pass_through(gateway: GatewayServer, sent: list[UpstreamServer]) -> None:
    client = sdk(gateway)
    floats = client.embeddings.create(
        model=EMBEDDER, input=["first text", "second text"], encoding_format="float"
    )
    assert [d.embedding for d in floats.data] == [
        pytest.approx(embedding_of("first text")),
        pytest.approx(embedding_of("second text")),
    ]
    assert floats.usage.prompt_tokens == 4
    raw = httpx.post(
        gateway.url + "/embeddings",
        json={"model": EMBEDDER, "input": "first text", "encoding_format": "base64"},
        headers={"authorization": f"Bearer {KEYS['alice']}"},
        timeout=10,
    )
    vector = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    assert vector.tolist() == pytest.approx(embedding_of("first text"))
    # The SDK asks for base64 by default and decodes it: the same vector.
    assert client.embeddings.create(model=EMBEDDER, input="first text").data[0].embedding == pytest.approx(
        embedding_of("first text")
    )


def test_identical_requests_are_answered_from_the_cache_per_tenant(
    gateway: GatewayServer, sent: list[UpstreamServer]
) -> None:
    def ask(tenant: str) -> str:
        answer = sdk(gateway, tenant).embeddings.with_raw_response.create(model=EMBEDDER, input="cache me")
        assert answer.parse().data[0].embedding == pytest.approx(embedding_of("cache me"))
        return answer.headers["x-radixgate-cache"]

    assert [ask("alice"), ask("alice"), ask("bob"), ask("bob")] == ["miss", "hit", "miss", "hit"]
    assert embedding_requests(sent) == 2


def test_the_least_loaded_worker_serves_each_request(
    gateway: GatewayServer, sent: list[UpstreamServer]
) -> None:
    client = sdk(gateway)
    for i in range(4):
        client.embeddings.create(model=EMBEDDER, input=f"spread {i}")
    assert [sum(r.path == "/v1/embeddings" for r in u.requests) for u in sent] == [2, 2]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": EMBEDDER, "input": "x", "stream": True}, "stream"),
        ({"model": EMBEDDER, "input": []}, "input"),
        ({"model": EMBEDDER, "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": EMBEDDER}, "input"),
    ],
)
def test_bad_requests_are_400_naming_the_field(
    gateway: GatewayServer, body: dict[str, object], param: str
) -> None:
    answer = httpx.post(
        gateway.url + "/embeddings",
        json=body,
        headers={"authorization": f"Bearer {KEYS['alice']}"},
        timeout=10,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
