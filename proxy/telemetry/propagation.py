"""W3C Trace Context (`traceparent`/`tracestate`) in and out, on the request's hot path.

The same rules as OpenTelemetry's `TraceContextTextMapPropagator`, without its regex and
getter/setter indirection (a few microseconds a request that every request pays).
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACEPARENT_LENGTH = 55  # "00-" + 32 + "-" + 16 + "-" + 2
_HEX = frozenset("0123456789abcdef")


def extract(traceparent: str, tracestate: str | None = None) -> Context | None:
    """The remote parent named by the headers, or None when `traceparent` is invalid."""
    value = traceparent.strip()
    if len(value) < _TRACEPARENT_LENGTH or (len(value) > _TRACEPARENT_LENGTH and value[55] != "-"):
        return None
    version, trace_hex, span_hex, flags_hex = value[:2], value[3:35], value[36:52], value[53:55]
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    if version == "ff" or (version == "00" and len(value) != _TRACEPARENT_LENGTH):
        return None
    if not _HEX.issuperset(version + trace_hex + span_hex + flags_hex):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    state = TraceState.from_header([tracestate]) if tracestate else None
    span_context = SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(flags_hex, 16)), trace_state=state
    )
    return trace.set_span_in_context(NonRecordingSpan(span_context))


def inject(span: trace.Span, headers: dict[str, str]) -> None:
    """Add `span`'s `traceparent` (and `tracestate`) to `headers`; nothing for an invalid span."""
    span_context = span.get_span_context()
    if not span_context.is_valid:
        return
    headers[TRACEPARENT] = (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{span_context.trace_flags:02x}"
    )
    if span_context.trace_state:
        headers[TRACESTATE] = span_context.trace_state.to_header()
