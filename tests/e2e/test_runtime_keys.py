"""API keys created and revoked at run time, through the real gateway: shown once, stored hashed,
working at once for the openai SDK, still there after a restart, and an admin matter only."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import openai
import pytest

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.settings import ApiKeySettings, AuthSettings, Settings
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

ADMIN, TENANT = "sk-ops", "sk-configured"


def settings(upstream: UpstreamServer, ledger: Path) -> Settings:
    keys = [
        ApiKeySettings(tenant="ops", sha256=hash_key(ADMIN), admin=True),
        ApiKeySettings(tenant="acme", sha256=hash_key(TENANT)),
    ]
    return gateway_settings(upstream.url, auth=AuthSettings(api_keys=keys, ledger_path=str(ledger)))


def admin(
    method: str, gateway: GatewayServer, path: str, key: str = ADMIN, **kwargs: object
) -> httpx.Response:
    return httpx.request(
        method, gateway.base_url + path, headers={"authorization": f"Bearer {key}"}, timeout=5, **kwargs
    )


def completes(gateway: GatewayServer, key: str) -> bool:
    with openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0, timeout=10) as sdk:
        try:
            sdk.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        except openai.AuthenticationError:
            return False
    return True


def test_keys_are_created_used_revoked_and_survive_a_restart(
    tmp_path: Path, upstream_server: UpstreamServer
) -> None:
    ledger = tmp_path / "usage.sqlite3"
    gateway = GatewayServer(create_app(settings(upstream_server, ledger))).start()
    try:
        assert admin("POST", gateway, "/admin/keys", TENANT, json={"tenant": "x"}).status_code == 403
        created = admin("POST", gateway, "/admin/keys", json={"tenant": "globex"})
        assert created.status_code == 201
        new = created.json()
        assert new["tenant"] == "globex" and not new["admin"] and new["key"].startswith("rg-")
        assert completes(gateway, new["key"])
        usage = admin("GET", gateway, "/v1/usage", new["key"]).json()
        assert usage["tenant"] == "globex" and usage["requests"] == 1
        listed = admin("GET", gateway, "/admin/keys").json()["keys"]
        assert [k["id"] for k in listed] == [new["id"]] and "key" not in listed[0]
        doomed = admin("POST", gateway, "/admin/keys", json={"tenant": "initech"}).json()
        assert admin("DELETE", gateway, f"/admin/keys/{doomed['id']}").status_code == 200
        assert not completes(gateway, doomed["key"])
        assert admin("DELETE", gateway, f"/admin/keys/{doomed['id']}").status_code == 404
        assert admin("POST", gateway, "/admin/keys", json={"tenant": ""}).status_code == 400
    finally:
        gateway.stop()
    stored = sqlite3.connect(ledger).execute("SELECT sha256 FROM api_keys").fetchall()
    assert new["key"].encode() not in b"".join(bytes(row[0]) for row in stored)  # hashed, never the key
    restarted = GatewayServer(create_app(settings(upstream_server, ledger))).start()
    try:
        assert completes(restarted, new["key"]) and not completes(restarted, doomed["key"])
        assert completes(restarted, TENANT)  # configured keys keep working beside them
    finally:
        restarted.stop()


@pytest.mark.parametrize("body", [{"tenant": "a b"}, {"tenant": "acme", "extra": 1}, {}])
def test_a_bad_key_request_is_a_400(
    body: dict[str, object], tmp_path: Path, upstream_server: UpstreamServer
) -> None:
    gateway = GatewayServer(create_app(settings(upstream_server, tmp_path / "u.sqlite3"))).start()
    try:
        assert admin("POST", gateway, "/admin/keys", json=body).status_code == 400
    finally:
        gateway.stop()
