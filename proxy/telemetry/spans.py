"""A lean tracer for the request path, feeding the SDK's span processors and exporters.

The SDK's `Tracer` validates and copies every attribute, keeps span limits, bounded lists and
its own self-metrics; for the two or three spans of each request that costs tens of
microseconds. `LeanTracer` keeps what a trace needs (sampling through the SDK sampler, ids from
the SDK id generator, parent/child links, attributes, events, status) in a slotted object and
hands the finished span to the same span processor as an SDK `ReadableSpan`, so batching and
OTLP export are the SDK's own. Attribute values are taken as given (the request path sets only
strings, numbers, booleans and sequences of them). Span processors see `on_end` only: the
processors radixgate configures (batch, simple) do nothing in `on_start`.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import Decision, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util._decorator import _agnosticcontextmanager
from opentelemetry.util.types import Attributes, AttributeValue

_UNSET = Status(StatusCode.UNSET)


class LeanTracer(trace.Tracer):
    """Starts `LeanSpan`s; finished spans go to `processor.on_end`."""

    __slots__ = ("_id_generator", "_processor", "_random_ids", "_resource", "_sampler", "_scope")

    def __init__(
        self,
        *,
        resource: Resource,
        sampler: Sampler,
        id_generator: IdGenerator,
        processor: SpanProcessor,
        scope: InstrumentationScope,
    ) -> None:
        self._resource = resource
        self._sampler = sampler
        self._id_generator = id_generator
        self._random_ids = id_generator.is_trace_id_random()
        self._processor = processor
        self._scope = scope

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        parent: SpanContext | None = trace.get_current_span(context).get_span_context()
        if parent is not None and parent.is_valid:
            trace_id = parent.trace_id
            random_ids = parent.trace_flags.random_trace_id
        else:
            parent = None
            trace_id = self._id_generator.generate_trace_id()
            random_ids = self._random_ids
        sampling = self._sampler.should_sample(context, trace_id, name, kind, attributes, links)
        flags = TraceFlags.SAMPLED if sampling.decision is Decision.RECORD_AND_SAMPLE else TraceFlags.DEFAULT
        if random_ids:
            flags |= TraceFlags.RANDOM_TRACE_ID
        span_context = SpanContext(
            trace_id,
            self._id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(flags),
            trace_state=sampling.trace_state,
        )
        if sampling.decision is Decision.DROP:
            return trace.NonRecordingSpan(span_context)
        return LeanSpan(
            self,
            name,
            span_context,
            parent,
            kind,
            dict(sampling.attributes) if sampling.attributes else {},
            list(links) if links else [],
            start_time or time.time_ns(),
        )

    @_agnosticcontextmanager  # what the API's Tracer declares (a plain contextmanager otherwise)
    def start_as_current_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current


class LeanSpan(trace.Span):
    """A recording span that becomes an SDK `ReadableSpan` when it ends."""

    __slots__ = (
        "_attributes",
        "_context",
        "_end_time",
        "_events",
        "_kind",
        "_links",
        "_name",
        "_parent",
        "_start_time",
        "_status",
        "_tracer",
    )

    def __init__(
        self,
        tracer: LeanTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, AttributeValue],
        links: list[Link],
        start_time: int,
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._attributes = attributes
        self._links = links
        self._events: list[Event] = []
        self._status = _UNSET
        self._start_time = start_time
        self._end_time: int | None = None

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self._end_time is None:
            self._attributes[key] = tuple(value) if isinstance(value, list) else value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._end_time is None:
            for key, value in attributes.items():
                self._attributes[key] = tuple(value) if isinstance(value, list) else value

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        if self._end_time is None:
            self._events.append(
                Event(name, dict(attributes) if attributes else {}, timestamp or time.time_ns())
            )

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        if self._end_time is None and context.is_valid:
            self._links.append(Link(context, attributes))

    def update_name(self, name: str) -> None:
        if self._end_time is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end_time is not None or self._status.status_code is StatusCode.OK:
            return  # OK is final, as in the SDK
        self._status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        event_attributes: dict[str, AttributeValue] = {
            "exception.type": type(exception).__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            event_attributes.update(attributes)
        self.add_event("exception", event_attributes, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            return
        self._end_time = end_time or time.time_ns()
        tracer = self._tracer
        tracer._processor.on_end(
            ReadableSpan(
                name=self._name,
                context=self._context,
                parent=self._parent,
                resource=tracer._resource,
                attributes=self._attributes,
                events=self._events,
                links=self._links,
                kind=self._kind,
                status=self._status,
                start_time=self._start_time,
                end_time=self._end_time,
                instrumentation_scope=tracer._scope,
            )
        )
