"""Routing decisions are visible: a span per decision and Prometheus series per worker and policy."""

from __future__ import annotations

import msgspec
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from adapters.schema import PromptTokensDetails, Usage
from proxy.routing.admin import worker_status
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.routing.pool import WorkerPool
from proxy.telemetry import semconv
from proxy.telemetry.prometheus import MetricsRegistry
from tests.proxy.routing.conftest import FakeEngine, chat_request


async def test_each_decision_has_a_span_and_counters() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = MetricsRegistry()
    specs = [WorkerSpec(url=f"http://127.0.0.1:{9000 + i}", id=f"w{i}", models=["m"]) for i in range(2)]
    pool = WorkerPool(
        ["m"],
        specs,
        msgspec.convert({}, RoutingSettings),
        engine_factory=FakeEngine,
        metrics=registry,
        tracer=provider.get_tracer("test"),
    )
    first = await pool.acquire(chat_request("shared system prompt " * 20, "a"))
    first.release(usage=None, failed=False)
    second = await pool.acquire(chat_request("shared system prompt " * 20, "b"))
    assert exporter.get_finished_spans() and len(exporter.get_finished_spans()) == 1  # open until released
    second.release(usage=None, failed=True)

    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [semconv.ROUTING_SPAN_NAME] * 2
    attributes = spans[1].attributes or {}
    assert attributes[semconv.ROUTING_POLICY] == "cache_aware"
    assert attributes[semconv.ROUTING_WORKER_ID] == first.worker_id
    assert attributes[semconv.ROUTING_MATCH_TOKENS] > 100  # ~470 bytes at 4 bytes per token
    assert attributes[semconv.ROUTING_CANDIDATES] == 2
    assert f"{first.worker_id}=" in str(attributes[semconv.ROUTING_WORKER_LOADS])

    text = registry.render().decode()
    labels = f'policy="cache_aware",reason="best_cost",worker="{first.worker_id}"'
    assert f"radixgate_routing_decisions_total{{{labels}}} 1.0" in text
    assert f'radixgate_routing_worker_failures_total{{worker="{first.worker_id}"}} 1.0' in text
    assert f'radixgate_routing_worker_up{{worker="{first.worker_id}"}}' in text
    assert "radixgate_routing_decision_seconds_bucket" in text


async def test_the_routing_span_and_metrics_compare_the_prediction_with_the_engines_cached_tokens() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = MetricsRegistry()
    specs = [WorkerSpec(url=f"http://127.0.0.1:{9000 + i}", id=f"w{i}", models=["m"]) for i in range(2)]
    pool = WorkerPool(
        ["m"],
        specs,
        msgspec.convert({}, RoutingSettings),
        engine_factory=FakeEngine,
        metrics=registry,
        tracer=provider.get_tracer("test"),
    )
    system = "shared system prompt " * 40  # 840 bytes, ~210 tokens at 4 bytes per token
    first = await pool.acquire(chat_request(system, "a"))
    first.release(
        usage=Usage(prompt_tokens=200, prompt_tokens_details=PromptTokensDetails(cached_tokens=0)),
        failed=False,
    )
    second = await pool.acquire(chat_request(system, "b"))
    assert second.worker_id == first.worker_id
    # The engine says 150 of its 200 prompt tokens were cached; the tree predicted nearly all.
    second.release(
        usage=Usage(prompt_tokens=200, prompt_tokens_details=PromptTokensDetails(cached_tokens=150)),
        failed=False,
    )

    span = exporter.get_finished_spans()[-1]
    attributes = span.attributes or {}
    assert attributes[semconv.ROUTING_WORKER_ID] == second.worker_id
    assert attributes[semconv.ROUTING_REASON] == "best_cost"
    assert attributes[semconv.ROUTING_OUTCOME] == "ok"
    assert attributes[semconv.ROUTING_CACHED_TOKENS] == 150
    error = attributes[semconv.ROUTING_PREDICTION_ERROR]
    assert isinstance(error, int) and 30 < error <= 50  # predicted ~190 of 200, engine 150

    text = registry.render().decode()
    worker = f'worker="{second.worker_id}"'
    assert f"radixgate_routing_prediction_error_tokens_count{{{worker}}} 2.0" in text
    assert f"radixgate_routing_reported_cached_tokens_total{{{worker}}} 150.0" in text
    status = worker_status(pool, next(w for w in pool.workers() if w.id == second.worker_id))
    assert status.predictions == 2 and 15 < status.mean_prediction_error_tokens <= 25
