"""Traces in a real trace UI: the gateway exports OTLP over gRPC to Arize Phoenix (started here on
loopback from `make phoenix`'s venv), and the spans are read back through Phoenix's REST API: the
request's SERVER span with its routing, response-cache and upstream children, and their GenAI
attributes."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from proxy.app import create_app
from proxy.routing.launch import free_port
from proxy.telemetry import Telemetry, TelemetrySettings, semconv
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

REPO = Path(__file__).resolve().parents[2]
PHOENIX = REPO / ".venv-phoenix" / "bin" / "phoenix"
START_TIMEOUT_S = 120.0
"""Phoenix's first start creates its database: ~25 s on the 2-core CI machine."""
PROJECT = "default"


class Phoenix:
    def __init__(self, working_dir: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.grpc_port = free_port()
        environ = {
            **os.environ,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": self.url.rsplit(":", 1)[1],
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_WORKING_DIR": str(working_dir),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        self.log = (working_dir / "phoenix.log").open("w")
        self.process = subprocess.Popen(
            [str(PHOENIX), "serve"], env=environ, stdout=self.log, stderr=subprocess.STDOUT
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.process.poll() is None, "phoenix exited"
            assert time.monotonic() < deadline, "phoenix did not start"
            time.sleep(0.5)

    def spans(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/v1/projects/{PROJECT}/spans", params={"limit": 1000}, timeout=10)
        response.raise_for_status()
        data: list[dict[str, Any]] = response.json()["data"]
        return data

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    if not PHOENIX.is_file():
        pytest.skip("Arize Phoenix is not installed (`make phoenix`; `.ci/run` does it)")
    server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_the_gateway_traces_arrive_in_phoenix(phoenix: Phoenix, upstream: UpstreamServer) -> None:
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{phoenix.grpc_port}", insecure=True)
    telemetry = Telemetry.from_settings(
        TelemetrySettings(), service_version="test", span_processor=BatchSpanProcessor(exporter)
    )
    gateway = GatewayServer(create_app(gateway_settings(upstream.url), telemetry=telemetry)).start()
    try:
        with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=10) as sdk:
            messages: Any = [{"role": "user", "content": "Trace me."}]
            for _ in range(2):  # a miss that reaches the upstream, then a response-cache hit
                sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, temperature=0)
    finally:
        gateway.stop()  # the app's shutdown flushes the batch processor

    deadline = time.monotonic() + 30
    while len(spans := phoenix.spans()) < 6:  # 2 SERVER, 2 cache lookups, 1 route, 1 CLIENT
        assert time.monotonic() < deadline, [s["name"] for s in spans]
        time.sleep(0.5)
    servers = [s for s in spans if s["name"] == "POST /v1/chat/completions"]
    assert len(servers) == 2
    miss_trace, hit_trace = sorted(servers, key=lambda s: s["start_time"])

    def children(server: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in spans if s["parent_id"] == server["context"]["span_id"]}

    missed = children(miss_trace)
    assert set(missed) == {semconv.RESPONSE_CACHE_SPAN_NAME, semconv.ROUTING_SPAN_NAME, f"chat {MODEL}"}
    assert missed[semconv.RESPONSE_CACHE_SPAN_NAME]["attributes"][semconv.RESPONSE_CACHE_HIT] is False
    route = missed[semconv.ROUTING_SPAN_NAME]["attributes"]
    assert route[semconv.ROUTING_POLICY] == "cache_aware"
    assert route[semconv.ROUTING_WORKER_ID].endswith(f"127.0.0.1:{upstream.port}")
    upstream_call = missed[f"chat {MODEL}"]["attributes"]
    assert upstream_call[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert upstream_call[semconv.GEN_AI_REQUEST_MODEL] == MODEL
    assert upstream_call[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert upstream_call[semconv.SERVER_PORT] == upstream.port
    assert miss_trace["attributes"][semconv.HTTP_RESPONSE_STATUS_CODE] == 200

    hit = children(hit_trace)
    assert set(hit) == {semconv.RESPONSE_CACHE_SPAN_NAME}  # answered from the cache: no route, no call
    assert hit[semconv.RESPONSE_CACHE_SPAN_NAME]["attributes"][semconv.RESPONSE_CACHE_HIT] is True
