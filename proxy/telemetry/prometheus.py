"""The Prometheus registry behind `GET /metrics`, and the gateway's own series.

Each `Telemetry` owns one `MetricsRegistry` (not prometheus_client's global one, so several
apps in one process never collide). Other parts of the gateway add their series through it:

    hits = telemetry.prometheus.counter("cache_hits_total", "Response cache hits.", ["tier"])

or register a collector that reads their state only when scraped (`add_collector`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

METRIC_PREFIX = "radixgate_"
"""Every series radixgate exports starts with this."""

DEFAULT_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
)
"""Seconds; from sub-millisecond gateway work up to long generations."""

CONTENT_TYPE = "text/plain; version=0.0.4"
"""The classic Prometheus text format every scraper reads (Litestar appends the utf-8 charset)."""

_M = TypeVar("_M", Counter, Gauge, Histogram)


class LoopValue:
    """prometheus_client's per-series value without its lock.

    Every series made through `MetricsRegistry` is updated only on the event loop's thread (the
    request path, the routing observer, the cache step), so the mutex each update takes guards
    nothing, and it was a large share of an increment. A scrape from another thread reads a float,
    which never tears.
    """

    __slots__ = ("_exemplar", "_value")
    _multiprocess = False

    def __init__(self) -> None:
        self._value = 0.0
        self._exemplar: object = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: object) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> object:
        return self._exemplar


_LOCKED = values.ValueClass is values.MutexValue
"""False in prometheus_client's multiprocess mode: its values then live in shared files and stay."""


class _LoopCounter(Counter):
    # The updates below skip prometheus_client's checks where they cannot fail: a series whose
    # value is a `LoopValue` is observable (`_metric_init` runs only for those), and no exemplar is
    # given. That turns 4 Python calls per update into 1; ~15 updates per request.
    _loop: LoopValue | None = None

    def _metric_init(self) -> None:
        super()._metric_init()
        if _LOCKED:
            self._value = self._loop = LoopValue()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        loop = self._loop
        if loop is None or exemplar or amount < 0:
            super().inc(amount, exemplar)
        else:
            loop._value += amount


class _LoopGauge(Gauge):
    _loop: LoopValue | None = None

    def _metric_init(self) -> None:
        super()._metric_init()
        if _LOCKED:  # the registry makes gauges in the default mode, never "mostrecent"
            self._value = self._loop = LoopValue()

    def inc(self, amount: float = 1) -> None:
        loop = self._loop
        if loop is None:
            super().inc(amount)
        else:
            loop._value += amount

    def dec(self, amount: float = 1) -> None:
        loop = self._loop
        if loop is None:
            super().dec(amount)
        else:
            loop._value -= amount


class _LoopHistogram(Histogram):
    _loop: LoopValue | None = None

    def _metric_init(self) -> None:
        super()._metric_init()
        if _LOCKED:
            self._sum = self._loop = LoopValue()
            self._loop_buckets = [LoopValue() for _ in self._buckets]
            self._buckets = self._loop_buckets

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        loop = self._loop
        if loop is None or exemplar or amount != amount:  # NaN falls in no bucket: the library's way
            super().observe(amount, exemplar)
            return
        loop._value += amount
        # The first bucket whose upper bound is >= amount (the library scans them in order).
        self._loop_buckets[bisect_left(self._upper_bounds, amount)]._value += 1


class MetricsRegistry:
    """A private Prometheus registry. Asking twice for the same name returns the same metric."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}

    def counter(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> Counter:
        """A counter named `radixgate_<name>` (give `name` without the prefix)."""
        metric = self._get(name, Counter)
        if metric is None:
            metric = _LoopCounter(METRIC_PREFIX + name, documentation, labelnames, registry=self.registry)
            self._metrics[name] = metric
        return metric

    def gauge(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> Gauge:
        """A gauge named `radixgate_<name>`."""
        metric = self._get(name, Gauge)
        if metric is None:
            metric = _LoopGauge(METRIC_PREFIX + name, documentation, labelnames, registry=self.registry)
            self._metrics[name] = metric
        return metric

    def histogram(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS,
    ) -> Histogram:
        """A histogram named `radixgate_<name>`."""
        metric = self._get(name, Histogram)
        if metric is None:
            metric = _LoopHistogram(
                METRIC_PREFIX + name, documentation, labelnames, registry=self.registry, buckets=buckets
            )
            self._metrics[name] = metric
        return metric

    def add_collector(self, collector: Collector) -> None:
        """Register a collector whose `collect()` runs at scrape time (for state read on demand)."""
        self.registry.register(collector)

    def render(self) -> bytes:
        """The Prometheus text exposition of every series."""
        return generate_latest(self.registry)

    def _get(self, name: str, kind: type[_M]) -> _M | None:
        metric = self._metrics.get(name)
        if metric is None:
            return None
        if not isinstance(metric, kind):
            kind_name = next(k.__name__ for k in (Counter, Gauge, Histogram) if isinstance(metric, k))
            raise ValueError(f"metric {name!r} is already registered as a {kind_name}")
        return metric


@dataclass(slots=True, frozen=True)
class UpstreamSeries:
    """The labelled children of one (model, provider, operation), resolved once and reused."""

    success_duration: Histogram
    error_duration: Histogram
    time_to_first_chunk: Histogram
    input_tokens: Counter
    output_tokens: Counter
    cache_read_tokens: Counter


TENANT_REFUSALS = ("rate_limit_exceeded", "insufficient_quota")
"""The reasons a tenant's limits refuse a request (the 429's `code`)."""


@dataclass(slots=True)
class GatewayMetrics:
    """The series the request path updates on every request.

    `labels()` validates and locks on every call; the request path instead keeps the labelled
    children it has resolved in small dicts (label sets are bounded by routes and models).
    """

    requests: Counter
    """HTTP requests by method, route template and status code."""
    request_duration: Histogram
    """Seconds from the request's first byte to the response's last, by route."""
    in_flight: Gauge
    """HTTP requests being served now."""
    upstream_duration: Histogram
    """Seconds per upstream call by model, provider, operation and outcome."""
    upstream_time_to_first_chunk: Histogram
    """Seconds to the first streamed chunk of an upstream call."""
    tokens: Counter
    """Tokens reported by upstreams, by model and type (input, output, cache_read)."""
    tenant_requests: Counter
    """Generation requests served, by tenant (tenants are configured, so the label is bounded)."""
    tenant_tokens: Counter
    """Tokens per tenant, by type (prompt, completion, cached), as the usage ledger counts them."""
    tenant_refused: Counter
    """Requests a tenant's limits refused, by reason (`rate_limit_exceeded`, `insufficient_quota`)."""
    _request_series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = field(default_factory=dict)
    _tenant_series: dict[str, tuple[Counter, Counter, Counter, Counter]] = field(default_factory=dict)
    _upstream_series: dict[tuple[str, str, str], UpstreamSeries] = field(default_factory=dict)

    def count_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One finished HTTP request."""
        series = self._request_series.get((method, route, status))
        if series is None:
            series = (self.requests.labels(method, route, str(status)), self.request_duration.labels(route))
            self._request_series[(method, route, status)] = series
        series[0].inc()
        series[1].observe(seconds)

    def upstream(self, model: str, provider: str, operation: str) -> UpstreamSeries:
        """The series of upstream calls for one model, provider and operation."""
        key = (model, provider, operation)
        series = self._upstream_series.get(key)
        if series is None:
            series = UpstreamSeries(
                success_duration=self.upstream_duration.labels(model, provider, operation, "success"),
                error_duration=self.upstream_duration.labels(model, provider, operation, "error"),
                time_to_first_chunk=self.upstream_time_to_first_chunk.labels(model, provider, operation),
                input_tokens=self.tokens.labels(model, "input"),
                output_tokens=self.tokens.labels(model, "output"),
                cache_read_tokens=self.tokens.labels(model, "cache_read"),
            )
            self._upstream_series[key] = series
        return series

    @classmethod
    def register(cls, registry: MetricsRegistry) -> GatewayMetrics:
        return cls(
            requests=registry.counter(
                "http_requests_total", "HTTP requests served.", ["method", "route", "status"]
            ),
            request_duration=registry.histogram(
                "http_request_duration_seconds", "HTTP request duration.", ["route"]
            ),
            in_flight=registry.gauge("http_requests_in_flight", "HTTP requests being served."),
            upstream_duration=registry.histogram(
                "upstream_request_duration_seconds",
                "Upstream engine call duration.",
                ["model", "provider", "operation", "outcome"],
            ),
            upstream_time_to_first_chunk=registry.histogram(
                "upstream_time_to_first_chunk_seconds",
                "Time to the first streamed chunk from the upstream engine.",
                ["model", "provider", "operation"],
            ),
            tokens=registry.counter("tokens_total", "Tokens reported by engines.", ["model", "type"]),
            tenant_requests=registry.counter(
                "tenant_requests_total", "Generation requests served per tenant.", ["tenant"]
            ),
            tenant_tokens=registry.counter(
                "tenant_tokens_total",
                "Tokens used per tenant (the usage ledger's figures).",
                ["tenant", "type"],
            ),
            tenant_refused=registry.counter(
                "tenant_refused_total", "Requests refused by a tenant's limits.", ["tenant", "reason"]
            ),
        )

    def tenant_usage(self, tenant: str, prompt: int, completion: int, cached: int) -> None:
        """One served request of `tenant` and its tokens."""
        series = self._tenant_series.get(tenant)
        if series is None:
            tokens = self.tenant_tokens
            series = self._tenant_series[tenant] = (
                self.tenant_requests.labels(tenant),
                tokens.labels(tenant, "prompt"),
                tokens.labels(tenant, "completion"),
                tokens.labels(tenant, "cached"),
            )
        series[0].inc()
        series[1].inc(prompt)
        series[2].inc(completion)
        series[3].inc(cached)

    def tenant_known(self, tenant: str) -> None:
        """Start a configured tenant's series at zero, so dashboards and alerts see them at once."""
        self.tenant_requests.labels(tenant)
        for kind in ("prompt", "completion", "cached"):
            self.tenant_tokens.labels(tenant, kind)
        for reason in TENANT_REFUSALS:
            self.tenant_refused.labels(tenant, reason)
