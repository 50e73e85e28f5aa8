"""Exporter choice from the standard `OTEL_*` variables, and the resource they shape."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import NoOpTracerProvider

from proxy.telemetry import Telemetry, TelemetrySettings
from proxy.telemetry.providers import build_meter_provider, build_resource, build_span_processor

ENDPOINT = "http://127.0.0.1:4318"


def _exporter_of(environ: dict[str, str]) -> object | None:
    processor = build_span_processor(environ)
    if processor is None:
        return None
    assert isinstance(processor, BatchSpanProcessor)
    exporter = processor._batch_processor._exporter
    processor.shutdown()
    return exporter


def test_no_endpoint_means_no_exporter() -> None:
    assert _exporter_of({}) is None
    assert build_meter_provider(build_resource("radixgate", "1"), {}) is None


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_an_endpoint_selects_otlp_http_in_a_batch_processor(variable: str) -> None:
    assert isinstance(_exporter_of({variable: ENDPOINT}), OTLPSpanExporter)


def test_traces_endpoint_does_not_turn_on_metrics() -> None:
    environ = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT}
    assert build_meter_provider(build_resource("radixgate", "1"), environ) is None


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, None),
        ({"OTEL_TRACES_EXPORTER": "console"}, ConsoleSpanExporter),
    ],
)
def test_sdk_disabled_and_exporter_choice(environ: dict[str, str], expected: type | None) -> None:
    exporter = _exporter_of(environ)
    assert (None if exporter is None else type(exporter)) is expected


def test_resource_takes_settings_then_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    resource = build_resource("gateway-a", "1.2.3")
    assert resource.attributes["service.name"] == "gateway-a"
    assert resource.attributes["service.version"] == "1.2.3"
    assert resource.attributes["telemetry.sdk.name"] == "opentelemetry"

    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs,deployment.environment.name=prod")
    resource = build_resource("gateway-a", "1.2.3")
    assert resource.attributes["service.name"] == "from-attrs"
    assert resource.attributes["deployment.environment.name"] == "prod"

    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    assert build_resource("gateway-a", "1.2.3").attributes["service.name"] == "from-env"


def test_without_exporter_telemetry_uses_the_noop_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_TRACES_EXPORTER",
    ):
        monkeypatch.delenv(variable, raising=False)
    telemetry = Telemetry.from_settings(TelemetrySettings(), service_version="1")
    assert isinstance(telemetry.tracer_provider, NoOpTracerProvider)
