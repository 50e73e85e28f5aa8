"""Every metric a dashboard or an alert rule names is on a real gateway's `/metrics` once traffic
has flowed through it (the openai SDK, a real upstream on loopback, a failing request included)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import create_app
from proxy.cache.settings import CacheSettings
from tests.deploy.artifacts import PROMETHEUS_OWN, alert_rules, every_named_metric
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import Fault, UpstreamServer

ENGINE_PREFIX = "radixgate_engine_"
"""The embedded engine's series, absent in front of an upstream: tests/e2e/test_engine_metrics.py
checks those the dashboards name, against a gateway serving the embedded engine."""
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Hi."}]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Sample names on `/metrics` after hits, misses, a stream and a failed request."""
    upstream = UpstreamServer(models=(MODEL,)).start()
    cache_dir: Path = tmp_path_factory.mktemp("cache")
    settings = gateway_settings(upstream.url, cache=CacheSettings(dir=cache_dir))
    gateway = GatewayServer(create_app(settings)).start()
    try:
        with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=10) as sdk:
            for _ in range(2):  # a miss, then a hit
                sdk.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=3)
            for chunk in sdk.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True):
                assert chunk.id
            upstream.faults.append(Fault(status=503))  # a failed attempt, then no other worker to try
            with pytest.raises(openai.APIStatusError):
                sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        text = httpx.get(f"{gateway.base_url}/metrics", timeout=5).text
        yield {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    finally:
        gateway.stop()
        upstream.stop()


def test_every_metric_the_dashboards_and_rules_name_is_exported(exported: set[str]) -> None:
    named = every_named_metric()
    assert len(named) > 20  # the extraction found the queries
    missing = {
        name: sorted(users)
        for name, users in named.items()
        if name not in exported and not name.startswith(ENGINE_PREFIX)
    }
    assert missing == {}


def test_the_rules_name_only_radixgate_series_and_prometheus_own() -> None:
    for rule in alert_rules():
        if "radixgate_" not in rule["expr"]:
            assert rule["expr"].split("{")[0] in PROMETHEUS_OWN
