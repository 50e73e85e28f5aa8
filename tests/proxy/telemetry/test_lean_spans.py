"""`LeanTracer` produces what the SDK tracer produces, and honours the SDK sampler."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, StatusCode

from proxy.telemetry import propagation
from proxy.telemetry.spans import LeanTracer

RESOURCE = Resource.create({"service.name": "lean-test"})
SCOPE = InstrumentationScope("radixgate", "1")
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def tracers(sampler: Sampler) -> tuple[tuple[trace.Tracer, InMemorySpanExporter], ...]:
    """A lean and an SDK tracer with the same sampler, each into its own in-memory exporter."""
    lean_exporter, sdk_exporter = InMemorySpanExporter(), InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE, sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(sdk_exporter))
    lean = LeanTracer(
        resource=RESOURCE,
        sampler=sampler,
        id_generator=provider.id_generator,
        processor=SimpleSpanProcessor(lean_exporter),
        scope=SCOPE,
    )
    return (lean, lean_exporter), (provider.get_tracer("radixgate", "1"), sdk_exporter)


def exercise(tracer: trace.Tracer) -> None:
    parent = propagation.extract(PARENT)
    with tracer.start_as_current_span("outer", context=parent, kind=SpanKind.SERVER) as outer:
        outer.set_attribute("http.route", "/v1/x")
        inner = tracer.start_span("inner", kind=SpanKind.CLIENT, attributes={"a": 1, "tags": ("x", "y")})
        inner.set_attributes({"b": "two", "reasons": ["stop"]})
        inner.update_name("inner renamed")
        inner.record_exception(ValueError("bad value"))
        inner.set_status(StatusCode.ERROR, "failed")
        inner.end()
        inner.set_attribute("after_end", True)  # ignored, as in the SDK
        outer.add_event("note", {"k": "v"})


def comparable(span: ReadableSpan) -> tuple[object, ...]:
    return (
        span.name,
        span.kind,
        dict(span.attributes or {}),
        [(e.name, sorted((e.attributes or {}).keys())) for e in span.events],
        span.status.status_code,
        span.status.description,
        span.resource.attributes["service.name"],
        span.instrumentation_scope.name if span.instrumentation_scope else None,
        span.parent is not None,
    )


def test_lean_spans_match_sdk_spans() -> None:
    (lean, lean_out), (sdk, sdk_out) = tracers(ParentBased(ALWAYS_ON))
    exercise(lean)
    exercise(sdk)
    lean_spans, sdk_spans = lean_out.get_finished_spans(), sdk_out.get_finished_spans()
    assert [comparable(s) for s in lean_spans] == [comparable(s) for s in sdk_spans]
    inner, outer = lean_spans
    assert inner.parent is not None and inner.parent.span_id == outer.context.span_id
    assert outer.parent is not None and outer.parent.is_remote
    assert f"{outer.context.trace_id:032x}" == PARENT.split("-")[1]
    assert inner.start_time is not None and inner.end_time is not None
    assert inner.start_time <= inner.end_time


@pytest.mark.parametrize("sampler", [ALWAYS_OFF, ParentBased(ALWAYS_OFF)])
def test_unsampled_spans_are_not_recorded_but_still_propagate(sampler: Sampler) -> None:
    (lean, out), _ = tracers(sampler)
    span = lean.start_span("dropped")
    assert not span.is_recording()
    headers: dict[str, str] = {}
    propagation.inject(span, headers)
    span.end()
    assert out.get_finished_spans() == ()
    assert headers["traceparent"].endswith("-02")  # a random trace id, not sampled


def test_sampled_parent_flag_is_followed() -> None:
    (lean, out), _ = tracers(ParentBased(ALWAYS_OFF))
    span = lean.start_span("child", context=propagation.extract(PARENT))
    assert span.is_recording()  # the remote parent was sampled
    span.end()
    assert len(out.get_finished_spans()) == 1


def test_ok_status_is_final() -> None:
    (lean, out), _ = tracers(ALWAYS_ON)
    span = lean.start_span("s")
    span.set_status(StatusCode.OK)
    span.set_status(StatusCode.ERROR, "later")
    span.end()
    (finished,) = out.get_finished_spans()
    assert finished.status.status_code is StatusCode.OK
