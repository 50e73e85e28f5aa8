"""A timing probe after Gu et al. 2025's prompt-cache audit, on the embedded engine: tenant B's time to
first token on a prefix tenant A has just cached cannot be told from a cold prefix's (two-sample KS
test, p > 0.05), while A's own repeat of it clearly can (the probe has the power to see a hit)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import openai
import pytest

from adapters.local import LocalEngineConfig
from proxy.app import create_app
from proxy.auth import hash_key
from proxy.cache.settings import CacheSettings
from proxy.settings import ApiKeySettings, AuthSettings, Settings
from tests.gateway_server import GatewayServer
from tests.stats import ks_two_sample

pytestmark = pytest.mark.slow

ENGINE = LocalEngineConfig(threads=2, kv_budget_tokens=32_768, max_running=2)
KEYS = {"alice": "sk-alice", "bob": "sk-bob"}
SAMPLES = 12
WORDS = [
    "river",
    "stone",
    "lamp",
    "orbit",
    "cedar",
    "velvet",
    "harbor",
    "quartz",
    "meadow",
    "signal",
    "ember",
    "tundra",
    "violet",
    "canyon",
]


def document(seed: int) -> str:
    rng = random.Random(seed)
    return f"Report {seed}: " + " ".join(rng.choice(WORDS) for _ in range(240))


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayServer]:
    auth = AuthSettings(api_keys=[ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()])
    settings = Settings(local_engine=ENGINE, auth=auth, cache=CacheSettings(response_cache=False))
    server = GatewayServer(create_app(settings)).start()
    yield server
    server.stop()


def first_token_s(client: openai.OpenAI, prompt: str) -> float:
    started = time.perf_counter()
    stream = client.completions.create(
        model=ENGINE.model_id, prompt=prompt, max_tokens=1, temperature=0, stream=True
    )
    for _ in stream:
        elapsed = time.perf_counter() - started
        break
    stream.close()
    return elapsed


def test_another_tenants_cached_prefix_times_like_a_cold_one(gateway: GatewayServer) -> None:
    alice = openai.OpenAI(base_url=gateway.url, api_key=KEYS["alice"], max_retries=0, timeout=120)
    bob = openai.OpenAI(base_url=gateway.url, api_key=KEYS["bob"], max_retries=0, timeout=120)
    first_token_s(bob, document(-1))  # warm the engine's kernels before anything is timed
    on_alices_prefix, cold, alice_again = [], [], []
    for sample in range(SAMPLES):
        shared, fresh = document(2 * sample), document(2 * sample + 1)
        first_token_s(alice, shared + " Summary:")  # alice caches the prefix
        probes = [("shared", shared), ("cold", fresh)]
        for kind, prefix in probes if sample % 2 else probes[::-1]:  # alternate which is timed first
            (on_alices_prefix if kind == "shared" else cold).append(first_token_s(bob, prefix + " Question:"))
        alice_again.append(first_token_s(alice, shared + " Answer:"))
    _, p_isolated = ks_two_sample(on_alices_prefix, cold)
    _, p_power = ks_two_sample(alice_again, cold)
    assert p_power < 0.05, (alice_again, cold)  # the probe sees a real prefix hit
    assert p_isolated > 0.05, (on_alices_prefix, cold)  # and sees none across tenants
    alice.close()
    bob.close()
