"""Panic mode end to end: a gateway started before its only upstream serves as soon as it is up."""

from __future__ import annotations

import httpx
import openai
import pytest

from proxy.routing.launch import free_port
from tests.e2e.routing_support import MODEL, SimWorker, admin_workers, start_gateway, wait_for


def test_a_gateway_started_before_its_only_upstream_works_as_soon_as_the_upstream_does() -> None:
    worker = SimWorker(free_port())  # its port is chosen, but nothing listens yet
    # Health checks a minute apart: the first request after the upstream starts must not wait for one.
    gateway = start_gateway([worker], health_interval_s=60.0, max_attempts=1)
    try:
        assert admin_workers(gateway)["w0"]["health"] == "down"
        health = httpx.get(gateway.base_url + "/health", timeout=5).json()
        assert health["details"]["components"]["panic:" + MODEL] == "degraded"
        listing = httpx.get(gateway.base_url + "/admin/workers", timeout=5).json()
        assert listing["panic"] == {MODEL: "w0"}
        with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=10) as client:
            with pytest.raises(openai.APIStatusError) as refused:  # tried, and nothing answers yet
                client.completions.create(model=MODEL, prompt="hello", max_tokens=2)
            assert refused.value.status_code in (502, 503)
            worker.start()
            answer = client.completions.create(model=MODEL, prompt="hello", max_tokens=2)
            assert answer.choices[0].text
        metrics = httpx.get(gateway.base_url + "/metrics", timeout=5).text
        assert f'radixgate_routing_panic_requests_total{{model="{MODEL}",worker="w0"}} 2.0' in metrics
        # The answer triggered a health check: the worker is up again without waiting a minute.
        wait_for(lambda: admin_workers(gateway)["w0"]["health"] == "up", timeout_s=5)
        assert httpx.get(gateway.base_url + "/admin/workers", timeout=5).json()["panic"] == {}
        assert (
            f'radixgate_routing_model_panic{{model="{MODEL}"}} 0.0'
            in httpx.get(gateway.base_url + "/metrics", timeout=5).text
        )
    finally:
        gateway.stop()
        worker.stop()
