"""GenAI histograms (names, units, buckets, attributes) and the Prometheus `/metrics` page."""

from __future__ import annotations

import json

import pytest
from litestar.testing import AsyncTestClient
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from adapters.errors import UpstreamUnreachable
from proxy.telemetry import MetricsRegistry, Telemetry, semconv
from tests.proxy.telemetry.conftest import ScriptedEngine, build_app, engine_request, metric_points

ANSWER = {
    "id": "cmpl-9",
    "model": "smollm2",
    "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23},
}
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


def histograms(reader: InMemoryMetricReader) -> dict[str, list[HistogramDataPoint]]:
    points = metric_points(reader.get_metrics_data())
    return {name: [p for p in values if isinstance(p, HistogramDataPoint)] for name, values in points.items()}


async def test_genai_histograms_use_the_convention_names_buckets_and_attributes(
    telemetry: Telemetry, metric_reader: InMemoryMetricReader
) -> None:
    engine = ScriptedEngine(body=json.dumps(ANSWER).encode())
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        await client.post("/v1/chat/completions", json=CHAT)

    found = histograms(metric_reader)
    assert semconv.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK not in found  # streams only
    (duration,) = found[semconv.GEN_AI_CLIENT_OPERATION_DURATION]
    assert duration.explicit_bounds == semconv.DURATION_BUCKETS
    assert duration.count == 1
    assert dict(duration.attributes) == {
        semconv.GEN_AI_OPERATION_NAME: "chat",
        semconv.GEN_AI_PROVIDER_NAME: "vllm",
        semconv.GEN_AI_REQUEST_MODEL: "smollm2",
        semconv.GEN_AI_RESPONSE_MODEL: "smollm2",
        semconv.SERVER_ADDRESS: "10.0.0.7",
        semconv.SERVER_PORT: 8000,
    }
    usage = {p.attributes[semconv.GEN_AI_TOKEN_TYPE]: p for p in found[semconv.GEN_AI_CLIENT_TOKEN_USAGE]}
    assert set(usage) == {"input", "output"}
    assert usage["input"].sum == 20 and usage["output"].sum == 3
    assert usage["input"].explicit_bounds == semconv.TOKEN_USAGE_BUCKETS


async def test_stream_records_time_to_first_chunk_once(
    telemetry: Telemetry, metric_reader: InMemoryMetricReader
) -> None:
    chunk = {"id": "c", "model": "smollm2", "choices": [{"index": 0, "delta": {"content": "x"}}]}
    engine = ScriptedEngine(chunks=[json.dumps(chunk).encode()] * 5)
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        await client.post("/v1/chat/completions", json={**CHAT, "stream": True})

    (ttfc,) = histograms(metric_reader)[semconv.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK]
    assert ttfc.count == 1
    assert ttfc.explicit_bounds == semconv.TIME_TO_FIRST_CHUNK_BUCKETS
    assert ttfc.attributes[semconv.GEN_AI_OPERATION_NAME] == "chat"


async def test_failed_operation_duration_carries_error_type(
    telemetry: Telemetry, metric_reader: InMemoryMetricReader
) -> None:
    engine = ScriptedEngine(error=UpstreamUnreachable("connection refused"))
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        await client.post("/v1/chat/completions", json=CHAT)

    found = histograms(metric_reader)
    (duration,) = found[semconv.GEN_AI_CLIENT_OPERATION_DURATION]
    assert duration.attributes[semconv.ERROR_TYPE] == "upstream_unreachable"
    assert semconv.GEN_AI_CLIENT_TOKEN_USAGE not in found


def prometheus_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


async def test_prometheus_page_counts_requests_upstream_calls_and_tokens(telemetry: Telemetry) -> None:
    engine = ScriptedEngine(
        body=json.dumps(
            {**ANSWER, "usage": {**ANSWER["usage"], "prompt_tokens_details": {"cached_tokens": 16}}}
        ).encode()
    )
    async with AsyncTestClient(build_app(telemetry, engine)) as client:
        for _ in range(3):
            await client.post("/v1/chat/completions", json=CHAT)
        await client.post("/boom")
        page = await client.get("/metrics")

    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = prometheus_samples(page.text)
    chat = frozenset({("method", "POST"), ("route", "/v1/chat/completions"), ("status", "200")})
    assert samples[("radixgate_http_requests_total", chat)] == 3
    boom = frozenset({("method", "POST"), ("route", "/boom"), ("status", "500")})
    assert samples[("radixgate_http_requests_total", boom)] == 1
    # Only the /metrics request itself is in flight while the page renders.
    assert samples[("radixgate_http_requests_in_flight", frozenset())] == 1
    upstream = frozenset(
        {("model", "smollm2"), ("provider", "vllm"), ("operation", "chat"), ("outcome", "success")}
    )
    assert samples[("radixgate_upstream_request_duration_seconds_count", upstream)] == 3
    for token_type, count in (("input", 60), ("output", 9), ("cache_read", 48)):
        key = ("radixgate_tokens_total", frozenset({("model", "smollm2"), ("type", token_type)}))
        assert samples[key] == count


def test_registry_returns_the_same_metric_and_rejects_a_kind_clash() -> None:
    registry = MetricsRegistry()
    hits = registry.counter("cache_hits_total", "Cache hits.", ["tier"])
    assert registry.counter("cache_hits_total", "Cache hits.", ["tier"]) is hits
    assert isinstance(hits, Counter)
    hits.labels("memory").inc(2)
    assert b'radixgate_cache_hits_total{tier="memory"} 2.0' in registry.render()
    with pytest.raises(ValueError, match="already registered as a Counter"):
        registry.gauge("cache_hits_total", "clash")


def test_two_telemetries_in_one_process_do_not_share_series(telemetry: Telemetry) -> None:
    engine = ScriptedEngine()
    other = Telemetry.from_settings(telemetry_settings(), service_version="1")
    op = other.start_operation(engine_request(json.dumps(CHAT).encode()), engine)
    op.fail(UpstreamUnreachable("down"))
    assert b'outcome="error"' in other.prometheus.render()
    assert b'outcome="error"' not in telemetry.prometheus.render()


def telemetry_settings():  # type: ignore[no-untyped-def]
    from proxy.telemetry import TelemetrySettings

    return TelemetrySettings()


def test_loop_series_count_as_prometheus_client_does() -> None:
    """The registry's lean `inc`/`dec`/`observe` give the exposition prometheus_client's own give."""
    ours = MetricsRegistry()
    theirs = CollectorRegistry()
    buckets = (0.001, 0.01, 1.0)
    pairs = [
        (
            ours.counter("c", "d", ["k"]).labels("x"),
            Counter("radixgate_c", "d", ["k"], registry=theirs).labels("x"),
        ),
        (ours.gauge("g", "d"), Gauge("radixgate_g", "d", registry=theirs)),
        (
            ours.histogram("h", "d", ["k"], buckets=buckets).labels("y"),
            Histogram("radixgate_h", "d", ["k"], registry=theirs, buckets=buckets).labels("y"),
        ),
    ]
    for counter in (pairs[0][0], pairs[0][1]):
        counter.inc()
        counter.inc(2.5)
        with pytest.raises(ValueError):
            counter.inc(-1)
    for gauge in (pairs[1][0], pairs[1][1]):
        gauge.inc()
        gauge.inc(3)
        gauge.dec(0.5)
    for histogram in (pairs[2][0], pairs[2][1]):
        for value in (0.0, 0.001, 0.005, 0.01, 0.5, 1.0, 7.0, float("inf"), float("nan"), -1.0):
            histogram.observe(value)
    with pytest.raises(ValueError):
        ours.counter("c", "d", ["k"]).inc()  # a labelled metric's parent is not observable

    def samples(text: str) -> list[tuple[str, str, str]]:
        return sorted(
            (s.name, repr(sorted(s.labels.items())), repr(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if not s.name.endswith("_created")
        )

    assert samples(ours.render().decode()) == samples(generate_latest(theirs).decode())
