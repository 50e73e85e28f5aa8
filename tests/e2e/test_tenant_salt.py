"""The tenant's cache salt is the gateway's to set: a client's salt, however its key is spelled in
JSON, never reaches an engine, and salting engines get exactly the gateway's."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from proxy.app import create_app
from proxy.auth import cache_salt, hash_key
from proxy.routing.config import WorkerSpec
from proxy.settings import ApiKeySettings, AuthSettings
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

KEY, SECRET = "sk-acme", "salt-secret"
FORGED = [
    b'"cache_salt": "forged"',
    b'"cache\\u005fsalt": "forged"',  # the same key, with an escaped underscore
    b'"\\u0063ache_salt": "forged"',
    b'"extra_key": "forged"',
    b'"cache_salt": "forged", "cache_salt": "forged-again"',
]


def body(forged: bytes) -> bytes:
    return b'{"model": "%s", "prompt": "hi", "max_tokens": 2, %s}' % (MODEL.encode(), forged)


@pytest.fixture(scope="module", params=["openai", "sglang"])
def salted_gateway(
    request: pytest.FixtureRequest, upstream_server: UpstreamServer
) -> Iterator[GatewayServer]:
    settings = gateway_settings(
        upstream_server.url,
        auth=AuthSettings(
            api_keys=[ApiKeySettings(tenant="acme", sha256=hash_key(KEY))], cache_salt_secret=SECRET
        ),
    )
    kind = request.param
    settings = type(settings)(
        **{
            **{name: getattr(settings, name) for name in settings.__struct_fields__},
            "workers": [WorkerSpec(url=upstream_server.url, kind=kind, models=[MODEL])],
        }
    )
    server = GatewayServer(create_app(settings)).start()
    server.kind = kind  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.mark.parametrize("forged", FORGED)
def test_a_client_salt_never_reaches_the_engine(
    forged: bytes, salted_gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    response = httpx.post(
        salted_gateway.url + "/completions",
        content=body(forged),
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    sent = upstream.generation_requests()[-1]
    assert b"forged" not in sent.body
    fields = sent.json
    assert "extra_key" not in fields
    if salted_gateway.kind == "openai":  # type: ignore[attr-defined]
        assert "cache_salt" not in fields  # an OpenAI-compatible server gets no salt at all
    else:
        assert fields["cache_salt"] == cache_salt(SECRET, "acme")
        assert sent.body.count(b"cache_salt") == 1
