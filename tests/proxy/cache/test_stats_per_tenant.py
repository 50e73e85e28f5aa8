"""`GET /v1/cache/stats` shows a tenant key only its own tenant's response-cache counters; an admin key
sees every tenant's."""

from __future__ import annotations

from litestar.testing import TestClient

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.settings import ApiKeySettings, AuthSettings, Settings
from tests.proxy.scripted_engine import ScriptedEngine, scripted_pool

KEYS = {"acme": "sk-acme", "globex": "sk-globex"}
ADMIN = "sk-ops"


def test_a_tenant_sees_its_own_counters_and_an_admin_all() -> None:
    keys = [ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()]
    keys.append(ApiKeySettings(tenant="ops", sha256=hash_key(ADMIN), admin=True))
    app = create_app(Settings(auth=AuthSettings(api_keys=keys)), router=scripted_pool([ScriptedEngine()]))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 4}
    with TestClient(app) as client:
        for _ in range(3):
            client.post(
                "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEYS['acme']}"}
            )

        def stats(key: str) -> dict[str, object]:
            response = client.get("/v1/cache/stats", headers={"authorization": f"Bearer {key}"})
            cache: dict[str, object] = response.json()["cache_manager"]["response_cache"]
            return cache

        acme, globex, every = stats(KEYS["acme"]), stats(KEYS["globex"]), stats(ADMIN)
    assert (acme["misses"], acme["hits"]) == (1, 2)
    assert (globex["misses"], globex["hits"]) == (0, 0)  # nothing of acme's traffic
    assert (every["misses"], every["hits"]) == (1, 2)
