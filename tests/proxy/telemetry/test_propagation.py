"""The hot-path W3C trace-context parser agrees with OpenTelemetry's propagator."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.telemetry import propagation

REFERENCE = TraceContextTextMapPropagator()
TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


def _reference(traceparent: str, tracestate: str | None) -> SpanContext | None:
    carrier = {"traceparent": traceparent}
    if tracestate is not None:
        carrier["tracestate"] = tracestate
    span_context = trace.get_current_span(REFERENCE.extract(carrier)).get_span_context()
    return span_context if span_context.is_valid else None


@pytest.mark.parametrize(
    "traceparent",
    [
        f"00-{TRACE}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-00",
        f"00-{TRACE}-{SPAN}-03",
        f" 00-{TRACE}-{SPAN}-01 ",
        f"01-{TRACE}-{SPAN}-01-future-field",  # a later version may append fields
        f"01-{TRACE}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 must be exactly 55 characters
        f"ff-{TRACE}-{SPAN}-01",
        f"00-{TRACE.upper()}-{SPAN}-01",
        f"00-{'0' * 32}-{SPAN}-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"00-{TRACE[:-1]}-{SPAN}-01",
        f"00_{TRACE}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-0g",
        "",
        "garbage",
    ],
)
@pytest.mark.parametrize("tracestate", [None, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"])
def test_extract_matches_the_reference_propagator(traceparent: str, tracestate: str | None) -> None:
    context = propagation.extract(traceparent, tracestate)
    expected = _reference(traceparent, tracestate)
    if expected is None:
        assert context is None
        return
    assert context is not None
    assert trace.get_current_span(context).get_span_context() == expected


def test_inject_writes_traceparent_and_tracestate() -> None:
    state = TraceState([("vendor", "x1")])
    span = NonRecordingSpan(
        SpanContext(
            int(TRACE, 16), int(SPAN, 16), is_remote=False, trace_flags=TraceFlags(1), trace_state=state
        )
    )
    headers: dict[str, str] = {}
    propagation.inject(span, headers)
    reference: dict[str, str] = {}
    REFERENCE.inject(reference, trace.set_span_in_context(span))
    assert headers == reference == {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=x1"}


def test_inject_skips_an_invalid_span() -> None:
    headers: dict[str, str] = {}
    propagation.inject(trace.INVALID_SPAN, headers)
    assert headers == {}
