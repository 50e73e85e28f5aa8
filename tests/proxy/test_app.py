"""The app in process (Litestar's TestClient) over a scripted engine: tenants reach the engine,
and no request body, however malformed, gets a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.testing import TestClient

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.cache.settings import CacheSettings
from proxy.settings import ApiKeySettings, AuthSettings, Settings
from tests.proxy.scripted_engine import BODY, ScriptedEngine, scripted_pool

ENGINE = ScriptedEngine("engine")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    auth = AuthSettings(
        api_keys=[ApiKeySettings(tenant="acme", sha256=hash_key("sk-acme"))], cache_salt_secret="secret"
    )
    with TestClient(create_app(Settings(auth=auth), router=scripted_pool([ENGINE]))) as client:
        yield client


def test_the_tenant_and_its_salt_travel_with_the_request(client: TestClient) -> None:
    ENGINE.calls.clear()
    response = client.post(
        "/v1/chat/completions",
        content=b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"x":1}',
        headers={"authorization": "Bearer sk-acme"},
    )
    assert response.status_code == 200 and response.content == BODY
    [request] = ENGINE.calls
    assert request.tenant_id == "acme" and len(request.cache_salt) == 64
    assert (
        request.raw_body == b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"x":1}'
    )


@pytest.mark.parametrize("header", [None, "Bearer sk-wrong"])
def test_wrong_or_missing_key_is_401(client: TestClient, header: str | None) -> None:
    headers = {"authorization": header} if header else {}
    response = client.post("/v1/completions", json={"model": "m", "prompt": "x"}, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
FIELDS = st.sampled_from(
    ["model", "messages", "prompt", "stream", "n", "stream_options", "max_tokens", "stop"]
)
BODIES = st.one_of(
    st.binary(max_size=40),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.dictionaries(FIELDS, JSON_VALUES, max_size=5).map(lambda value: json.dumps(value).encode()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_bad_input_never_gets_a_500(client: TestClient, body: bytes, path: str) -> None:
    response = client.post(path, content=body, headers={"authorization": "Bearer sk-acme"})
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_health_names_the_seeds_components_with_their_real_state() -> None:
    healthy, broken = ScriptedEngine("up"), ScriptedEngine("broken")
    broken.healthy = False
    settings = Settings(cache=CacheSettings(response_cache=False))
    with TestClient(create_app(settings, router=scripted_pool([healthy, broken]))) as client:
        components = client.get("/health").json()["details"]["components"]
    assert components == {
        "inference_runtime": "degraded",  # one of two workers is down
        "model_registry": "operational",  # the model still has a ready worker
        "cache_system": "disabled",
        "up": "operational",
        "broken": "down",
    }
