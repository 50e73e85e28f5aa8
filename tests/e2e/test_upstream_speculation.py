"""SGLang's and vLLM's own speculative-decoding figures in `/v1/cache/stats`: test upstreams serve
real Prometheus text `/metrics` (written by `prometheus_client`, as both engines do) with the
series each engine publishes, and the real gateway's health checks read them per worker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from proxy.app import create_app
from proxy.routing.config import RoutingSettings, WorkerKind, WorkerSpec
from proxy.settings import Settings
from tests.e2e.conftest import MODEL
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

LABELS = ("model_name", "engine")


def vllm_metrics(rounds: tuple[tuple[int, int, int], ...]) -> str:
    """vLLM's v1 spec-decode counters, one (drafts, draft tokens, accepted) per engine core."""
    registry = CollectorRegistry()
    drafts = Counter("vllm:spec_decode_num_drafts", "Drafts.", LABELS, registry=registry)
    drafted = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens.", LABELS, registry=registry)
    accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Accepted.", LABELS, registry=registry)
    per_pos = Counter(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "By position.",
        (*LABELS, "position"),
        registry=registry,
    )
    running = Gauge("vllm:num_requests_running", "Running.", LABELS, registry=registry)
    for core, (n_drafts, n_drafted, n_accepted) in enumerate(rounds):
        labels = (MODEL, str(core))
        drafts.labels(*labels).inc(n_drafts)
        drafted.labels(*labels).inc(n_drafted)
        accepted.labels(*labels).inc(n_accepted)
        per_pos.labels(*labels, "0").inc(n_accepted)
        running.labels(*labels).set(1)
    return generate_latest(registry).decode()


def sglang_metrics(accept_length: float, accept_rate: float) -> str:
    registry = CollectorRegistry()
    labels = ("model_name", "tp_rank")
    Gauge("sglang:num_running_reqs", "Running.", labels, registry=registry).labels(MODEL, "0").set(2)
    length = Gauge("sglang:spec_accept_length", "Accept length.", labels, registry=registry)
    length.labels(MODEL, "0").set(accept_length)
    rate = Gauge("sglang:spec_accept_rate", "Accept rate.", labels, registry=registry)
    rate.labels(MODEL, "0").set(accept_rate)
    return generate_latest(registry).decode()


def plain_metrics() -> str:
    """A vLLM that does not speculate: load series, no spec-decode ones."""
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "Running.", LABELS, registry=registry).labels(MODEL, "0").set(0)
    return generate_latest(registry).decode()


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, UpstreamServer]]:
    servers = {name: UpstreamServer(models=(MODEL,)).start() for name in ("vllm", "sglang", "plain")}
    servers["vllm"].metrics = vllm_metrics(((10, 40, 25), (5, 20, 5)))
    servers["sglang"].metrics = sglang_metrics(2.75, 0.6)
    servers["plain"].metrics = plain_metrics()
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="module")
def gateway(upstreams: dict[str, UpstreamServer]) -> Iterator[GatewayServer]:
    kinds: dict[str, WorkerKind] = {"vllm": "vllm", "sglang": "sglang", "plain": "vllm"}
    settings = Settings(
        workers=[
            WorkerSpec(url=server.url, kind=kinds[name], models=[MODEL], id=name)
            for name, server in upstreams.items()
        ],
        routing=RoutingSettings(health_interval_s=0.1),
    )
    server = GatewayServer(create_app(settings)).start()
    yield server
    server.stop()


def speculation(gateway: GatewayServer) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{gateway.url}/cache/stats", timeout=5).json()
    figures: dict[str, Any] = stats["cache_manager"]["speculation"]
    return figures


def wait_for_upstream(gateway: GatewayServer, accepted: int) -> dict[str, Any]:
    """The stats once the vLLM row shows `accepted` tokens and SGLang's row is in."""
    deadline = time.monotonic() + 10
    while True:
        stats = speculation(gateway)
        rows = {row["worker"]: row for row in stats["upstream"]}
        if "sglang" in rows and rows.get("vllm", {}).get("accepted_tokens") == accepted:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)


def test_each_engine_reports_its_own_speculation(gateway: GatewayServer) -> None:
    with openai.OpenAI(base_url=gateway.url, api_key="k", max_retries=0, timeout=10) as client:
        answer = client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert answer.choices[0].text
    stats = wait_for_upstream(gateway, 30)
    assert stats["implemented"] is True and stats["note"] == ""
    rows = {row["worker"]: row for row in stats["upstream"]}
    assert set(rows) == {"vllm", "sglang"}  # the worker without spec-decode series reports nothing
    assert rows["vllm"] == {
        "worker": "vllm",
        "engine": "vllm",
        "drafts": 15,
        "drafted_tokens": 60,
        "accepted_tokens": 30,
        "hit_rate": 50.0,
        "avg_depth": 2.0,
        "accept_length": None,
    }
    assert rows["sglang"] == {
        "worker": "sglang",
        "engine": "sglang",
        "drafts": None,
        "drafted_tokens": None,
        "accepted_tokens": None,
        "hit_rate": 60.0,
        "avg_depth": None,
        "accept_length": 2.75,
    }
    # vLLM's counters are the headline figures (no embedded engine here); SGLang's averages are not counts.
    assert (stats["hits"], stats["misses"], stats["hit_rate"]) == (30, 30, 50.0)
    assert (stats["verify_steps"], stats["tokens_generated"], stats["avg_depth"]) == (15, 45, 2.0)


def test_the_figures_follow_the_engines_counters(
    gateway: GatewayServer, upstreams: dict[str, UpstreamServer]
) -> None:
    upstreams["vllm"].metrics = vllm_metrics(((20, 80, 60),))
    stats = wait_for_upstream(gateway, 60)
    assert (stats["hits"], stats["misses"], stats["hit_rate"]) == (60, 20, 75.0)


def test_the_gateway_does_not_reexport_the_engines_series(gateway: GatewayServer) -> None:
    exported = httpx.get(f"{gateway.base_url}/metrics", timeout=5).text
    assert "spec_decode" not in exported and "spec_accept" not in exported
