"""Usage and budgets through the real gateway: `/v1/usage` for a tenant, `/admin/usage` for admins,
429 `insufficient_quota` once a budget is spent, and all of it still there after a restart."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.settings import ApiKeySettings, AuthSettings, Settings
from proxy.tenancy import TenantLimits
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

KEYS = {"acme": "sk-acme", "globex": "sk-globex"}
ADMIN = "sk-ops"


def settings(upstream: UpstreamServer, ledger: Path) -> Settings:
    keys = [ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()]
    keys.append(ApiKeySettings(tenant="ops", sha256=hash_key(ADMIN), admin=True))
    auth = AuthSettings(
        api_keys=keys,
        ledger_path=str(ledger),
        tenants={"acme": TenantLimits(token_budget=30, budget_period="day")},
    )
    return gateway_settings(upstream.url, auth=auth)


def usage(gateway: GatewayServer, key: str, path: str = "/v1/usage") -> httpx.Response:
    return httpx.get(gateway.base_url + path, headers={"authorization": f"Bearer {key}"}, timeout=5)


def test_usage_budgets_and_a_restart(tmp_path: Path, upstream_server: UpstreamServer) -> None:
    ledger = tmp_path / "usage.sqlite3"
    gateway = GatewayServer(create_app(settings(upstream_server, ledger))).start()
    try:
        with openai.OpenAI(base_url=gateway.url, api_key=KEYS["acme"], max_retries=0, timeout=10) as acme:
            answer = acme.completions.create(model=MODEL, prompt="one two three", max_tokens=8)
            assert answer.usage is not None
            spent = answer.usage.total_tokens
            mine = usage(gateway, KEYS["acme"]).json()
            assert mine["tenant"] == "acme" and mine["requests"] == 1 and mine["total_tokens"] == spent
            assert (mine["budget"], mine["budget_remaining"], mine["period"]) == (30, 30 - spent, "day")
            while usage(gateway, KEYS["acme"]).json()["budget_remaining"] > 0:
                acme.completions.create(model=MODEL, prompt="one two three", max_tokens=8)
            with pytest.raises(openai.RateLimitError) as spent_out:
                acme.completions.create(model=MODEL, prompt="again", max_tokens=8)
            assert spent_out.value.code == "insufficient_quota"
        assert usage(gateway, KEYS["globex"]).json()["requests"] == 0  # a tenant sees only its own
        assert usage(gateway, KEYS["acme"], "/admin/usage").status_code == 403
        every = {row["tenant"]: row for row in usage(gateway, ADMIN, "/admin/usage").json()["tenants"]}
        assert (every["acme"]["requests"] >= 2 and "globex" not in every) or every["globex"]["requests"] == 0
        before = every["acme"]
    finally:
        gateway.stop()
    restarted = GatewayServer(create_app(settings(upstream_server, ledger))).start()
    try:
        assert usage(restarted, KEYS["acme"]).json() == before  # written behind, read back
        acme = openai.OpenAI(base_url=restarted.url, api_key=KEYS["acme"], max_retries=0, timeout=10)
        with acme, pytest.raises(openai.RateLimitError):  # the budget is still spent
            acme.completions.create(model=MODEL, prompt="again", max_tokens=8)
    finally:
        restarted.stop()
