"""ASGI middleware: one SERVER span and the HTTP Prometheus series per request.

Use it either in Litestar's `middleware=[...]` (it then sees only requests that matched a route)
or around the whole app, `ServerSpanMiddleware(app=litestar_app, ...)`, to also see 404s and 405s.
Either way the route template comes from Litestar's `scope["path_template"]`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from proxy.asgi_types import StatusSend
from proxy.telemetry import propagation, semconv
from proxy.telemetry.prometheus import GatewayMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNMATCHED_ROUTE = "unmatched"
"""Prometheus `route` label of requests no route matched (keeps the label's cardinality bounded)."""


class ServerSpanMiddleware:
    """Wraps an ASGI app; every HTTP request gets a SERVER span that is current while it runs."""

    __slots__ = ("app", "metrics", "tracer", "tracing")

    def __init__(self, app: ASGIApp, *, tracer: trace.Tracer, metrics: GatewayMetrics) -> None:
        self.app = app
        self.tracer = tracer
        self.metrics = metrics
        self.tracing = not isinstance(tracer, trace.NoOpTracer)
        """False when spans are off: a request without a caller's trace then gets no span at all."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _RequestHeaders.read(scope["headers"])
        parent = headers.remote_parent()
        if not self.tracing and parent is None:  # nothing to record or to propagate: metrics only
            await self._counted(scope, receive, send)
            return
        started = time.perf_counter()
        method: str = scope["method"]
        span = self.tracer.start_span(
            method,
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes=_server_attributes(scope, method, headers),
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        response = StatusSend(send)
        send = response.send
        self.metrics.in_flight.inc()
        error_type: str | None = None
        try:
            await self.app(scope, receive, send)
        except BaseException as exc:
            error_type = type(exc).__qualname__
            if span.is_recording():
                span.record_exception(exc)
            raise
        finally:
            otel_context.detach(token)
            self.metrics.in_flight.dec()
            route: str | None = scope.get("path_template")
            self._finish(span, method, route, response.status, error_type)
            self.metrics.count_request(
                method, route or UNMATCHED_ROUTE, response.status or 500, time.perf_counter() - started
            )

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request with its Prometheus series and no span (tracing off, no caller's trace)."""
        started = time.perf_counter()
        response = StatusSend(send)
        send = response.send
        metrics = self.metrics
        metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send)
        finally:
            metrics.in_flight.dec()
            route: str | None = scope.get("path_template")
            seconds = time.perf_counter() - started
            metrics.count_request(scope["method"], route or UNMATCHED_ROUTE, response.status or 500, seconds)

    @staticmethod
    def _finish(
        span: trace.Span, method: str, route: str | None, status: int, error_type: str | None
    ) -> None:
        if not span.is_recording():
            span.end()
            return
        span.update_name(semconv.server_span_name(method, route))
        if route:
            span.set_attribute(semconv.HTTP_ROUTE, route)
        if status:
            span.set_attribute(semconv.HTTP_RESPONSE_STATUS_CODE, status)
        if error_type is None and status >= 500:
            error_type = str(status)
        if error_type is not None:
            span.set_attribute(semconv.ERROR_TYPE, error_type)
            span.set_status(trace.StatusCode.ERROR)
        span.end()


@dataclass(slots=True)
class _RequestHeaders:
    """The few request headers the SERVER span reads, found in one pass."""

    traceparent: bytes | None = None
    tracestate: bytes | None = None
    host: bytes | None = None
    user_agent: bytes | None = None

    @classmethod
    def read(cls, headers: list[tuple[bytes, bytes]]) -> _RequestHeaders:
        found = cls()
        for name, value in headers:
            if name == b"traceparent":
                found.traceparent = value
            elif name == b"tracestate":
                found.tracestate = value
            elif name == b"host":
                found.host = value
            elif name == b"user-agent":
                found.user_agent = value
        return found

    def remote_parent(self) -> otel_context.Context | None:
        """The caller's trace context from `traceparent`/`tracestate`, or None (the common case)."""
        if self.traceparent is None:
            return None
        return propagation.extract(
            self.traceparent.decode("latin-1"), self.tracestate.decode("latin-1") if self.tracestate else None
        )


def _server_attributes(scope: Scope, method: str, headers: _RequestHeaders) -> dict[str, AttributeValue]:
    """The HTTP server span's attributes known at the start: `server.address`/`server.port` from the
    `Host` header (the name the client used), else the listening socket; the peer's address."""
    attributes: dict[str, AttributeValue] = {
        semconv.HTTP_REQUEST_METHOD: method,
        semconv.URL_PATH: scope["path"],
        semconv.URL_SCHEME: scope.get("scheme", "http"),
        semconv.NETWORK_PROTOCOL_VERSION: scope.get("http_version", "1.1"),
    }
    server = scope.get("server")
    if headers.host:
        raw = headers.host.decode("latin-1")
        if raw.startswith("["):  # an IPv6 literal, `[::1]:8080`; the attribute has no brackets
            host, _, rest = raw[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = raw.partition(":")
        attributes[semconv.SERVER_ADDRESS] = host
        if port.isdigit():
            attributes[semconv.SERVER_PORT] = int(port)
        elif server:
            attributes[semconv.SERVER_PORT] = server[1]
    elif server:
        attributes[semconv.SERVER_ADDRESS] = server[0]
        if server[1] is not None:
            attributes[semconv.SERVER_PORT] = server[1]
    client = scope.get("client")
    if client:
        attributes[semconv.CLIENT_ADDRESS] = client[0]
    if headers.user_agent:
        attributes[semconv.USER_AGENT_ORIGINAL] = headers.user_agent.decode("latin-1")
    return attributes
