"""The admin scope: tenant keys never administer the gateway; without keys, only loopback does."""

from __future__ import annotations

import logging

import pytest
from litestar.testing import TestClient

from proxy.app import create_app
from proxy.auth import Authenticator, hash_key
from proxy.cli import _warn_if_open
from proxy.errors import ApiError
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.settings import ApiKeySettings, AuthSettings, ServerSettings, Settings

TENANT_KEY, ADMIN_KEY = "sk-tenant", "sk-admin"
ADMIN_CALLS = [
    ("GET", "/admin/workers", None),
    ("POST", "/admin/workers", {"url": "http://127.0.0.1:9555", "id": "extra", "models": ["m"]}),
    ("DELETE", "/admin/workers/extra", None),
    ("POST", "/v1/cache/clear", None),
    ("POST", "/v1/cache/warm", {"model": "m", "prompts": ["x"]}),
]


def keyed_settings(**routing: object) -> Settings:
    keys = [
        ApiKeySettings(tenant="acme", sha256=hash_key(TENANT_KEY)),
        ApiKeySettings(tenant="ops", sha256=hash_key(ADMIN_KEY), admin=True),
    ]
    return Settings(
        auth=AuthSettings(api_keys=keys),
        workers=[WorkerSpec(url="http://127.0.0.1:9", models=["m"])],
        routing=RoutingSettings(health_interval_s=60, **routing),  # type: ignore[arg-type]
    )


def call(client: TestClient, method: str, path: str, body: object, key: str | None) -> tuple[int, str]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    response = client.request(method, path, json=body, headers=headers)
    return response.status_code, (response.json().get("error") or {}).get("code") or ""


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
def test_a_tenant_key_gets_403_and_no_key_401(method: str, path: str, body: object) -> None:
    with TestClient(create_app(keyed_settings())) as client:
        assert call(client, method, path, body, TENANT_KEY) == (403, "permission_denied")
        assert call(client, method, path, body, None) == (401, "invalid_api_key")


def test_an_admin_key_administers() -> None:
    with TestClient(create_app(keyed_settings())) as client:
        statuses = [call(client, method, path, body, ADMIN_KEY)[0] for method, path, body in ADMIN_CALLS]
    assert statuses == [200, 201, 200, 200, 200]


def test_cache_stats_stay_open_to_tenants() -> None:
    with TestClient(create_app(keyed_settings())) as client:
        assert (
            client.get("/v1/cache/stats", headers={"authorization": f"Bearer {TENANT_KEY}"}).status_code
            == 200
        )


def test_without_keys_the_admin_api_refuses_clients_off_loopback() -> None:
    settings = Settings(workers=[WorkerSpec(url="http://127.0.0.1:9", models=["m"])])
    with TestClient(create_app(settings)) as client:  # its client address is "testclient", not loopback
        assert call(client, "GET", "/admin/workers", None, None) == (403, "permission_denied")
        assert call(client, "POST", "/v1/cache/clear", None, None) == (403, "permission_denied")
    auth = Authenticator(AuthSettings())
    assert auth.authorize_admin(None, "127.0.0.1").id == "anonymous"
    assert auth.authorize_admin(None, "::1").id == "anonymous"
    for host in ("10.0.0.7", "192.168.1.2", None):
        with pytest.raises(ApiError) as refused:
            auth.authorize_admin(None, host)
        assert refused.value.status == 403


@pytest.mark.parametrize(
    ("allowed", "url", "status"),
    [
        (None, "http://127.0.0.1:9556", 201),  # loopback
        (None, "http://evil.example:8000", 403),
        (None, "http://10.1.2.3:8000", 403),
        (["gpu-7.internal"], "http://gpu-7.internal:30000", 201),
        (["gpu-7.internal"], "http://127.0.0.1:9556", 403),  # an explicit list replaces the default
    ],
)
def test_run_time_workers_must_point_at_allowed_hosts(
    allowed: list[str] | None, url: str, status: int
) -> None:
    with TestClient(create_app(keyed_settings(allowed_worker_hosts=allowed))) as client:
        response = client.post(
            "/admin/workers", json={"url": url, "id": "new"}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
        )
    assert response.status_code == status
    if status == 403:
        assert response.json()["error"]["code"] == "worker_host_not_allowed"


def test_serving_beyond_loopback_without_keys_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="radixgate"):
        _warn_if_open(Settings(server=ServerSettings(host="0.0.0.0")))
        _warn_if_open(Settings())  # 127.0.0.1: no warning
    assert [record.getMessage().split(" with ")[0] for record in caplog.records] == [
        "radixgate listens on 0.0.0.0"
    ]


@pytest.mark.parametrize(
    "url",
    [
        rb"http://127.0.0.1:notaport",
        rb"http://[::1",
        rb"http://h\udbf5\udf31:%z",
    ],  # the last: lone surrogates
)
def test_a_malformed_worker_url_is_a_400(url: bytes) -> None:
    body = b'{"url": "%s", "id": "bad"}' % url
    headers = {"authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}
    with TestClient(create_app(keyed_settings())) as client:
        response = client.post("/admin/workers", content=body, headers=headers)
    assert response.status_code == 400, response.text
