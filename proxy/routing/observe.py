"""Making routing visible: Prometheus series per worker and policy, and a span per decision."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Tracer
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from proxy.routing.engine_series import EngineSeries
from proxy.routing.policies import Decision
from proxy.routing.worker import Worker
from proxy.telemetry import semconv
from proxy.telemetry.prometheus import METRIC_PREFIX, MetricsRegistry

DECISION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
"""Seconds; a decision should take well under a millisecond, tokenizing excluded."""
ERROR_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536)
"""Tokens of absolute prediction error: within a page, a message, a system prompt, a long history."""


class _WorkerGauges:
    """Reads per-worker state at scrape time instead of updating gauges on every request."""

    def __init__(self, workers: Callable[[], Iterable[Worker]]) -> None:
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        specs = (
            (
                semconv.ROUTING_WORKER_IN_FLIGHT_METRIC,
                "Requests in flight per worker.",
                lambda w: w.in_flight,
            ),
            (
                semconv.ROUTING_WORKER_QUEUED_WORK_METRIC,
                "Queued work per worker, in tokens (uncached prompt plus weighted output).",
                lambda w: w.queued_work,
            ),
            (
                semconv.ROUTING_WORKER_TREE_TOKENS_METRIC,
                "Tokens in the worker's routing tree.",
                lambda w: w.tree.total_tokens,
            ),
            (
                semconv.ROUTING_WORKER_UP_METRIC,
                "1 when the worker's health checks pass.",
                lambda w: w.health == "up",
            ),
            (
                semconv.ROUTING_WORKER_BREAKER_OPEN_METRIC,
                "1 when the worker's circuit breaker is open.",
                lambda w: w.breaker.state == "open",
            ),
        )
        workers = list(self._workers())
        for name, documentation, read in specs:
            family = GaugeMetricFamily(METRIC_PREFIX + name, documentation, labels=["worker"])
            for worker in workers:
                family.add_metric([worker.id], float(read(worker)))  # type: ignore[no-untyped-call]
            yield family
        yield _healthy_per_model(workers)
        yield _panic_per_model(workers)


ANY_MODEL = "*"
"""`model` label of workers that list no models (they serve every model)."""


def _healthy_per_model(workers: list[Worker]) -> Metric:
    """Workers able to take a request now (health up, breaker not open), per model they serve."""
    healthy: dict[str, int] = {}
    for worker in workers:
        up = worker.health == "up" and worker.breaker.state != "open" and not worker.draining
        for model in worker.models or [ANY_MODEL]:
            healthy[model] = healthy.get(model, 0) + up
    family = GaugeMetricFamily(
        METRIC_PREFIX + semconv.ROUTING_MODEL_HEALTHY_WORKERS_METRIC,
        "Workers serving the model whose health checks pass and whose breaker is closed.",
        labels=["model"],
    )
    for model, count in sorted(healthy.items()):
        family.add_metric([model], float(count))
    return family


def _panic_per_model(workers: list[Worker]) -> Metric:
    """1 for a model whose every worker is marked down: its requests go to the most recently healthy
    one anyway (panic mode) instead of a 503."""
    down: dict[str, bool] = {}
    for worker in workers:
        if worker.draining:
            continue
        for model in worker.models or [ANY_MODEL]:
            down[model] = down.get(model, True) and worker.health == "down"
    family = GaugeMetricFamily(
        METRIC_PREFIX + semconv.ROUTING_MODEL_PANIC_METRIC,
        "1 while every worker of the model is marked down and requests are tried on the most "
        "recently healthy one (panic mode).",
        labels=["model"],
    )
    for model, panic in sorted(down.items()):
        family.add_metric([model], float(panic))
    return family


@dataclass(frozen=True, slots=True)
class _DecisionSeries:
    decisions: Counter
    prompt_tokens: Counter
    match_tokens: Counter
    seconds: Histogram


@dataclass(slots=True)
class RoutingObserver:
    """Counters and spans of the router; without a registry only spans are produced."""

    tracer: Tracer
    registry: MetricsRegistry | None = None
    _series: dict[tuple[str, str, str], _DecisionSeries] = field(default_factory=dict)
    """Labelled series per (policy, worker, reason): `labels()` validates and locks on every call."""
    _spans: bool = field(init=False, default=True)
    """False for the no-op tracer, whose spans record nothing and propagate nothing: none is started."""

    def __post_init__(self) -> None:
        self._spans = not isinstance(self.tracer, trace.NoOpTracer)

    @classmethod
    def create(
        cls, registry: MetricsRegistry | None, tracer: Tracer | None, workers: Callable[[], Iterable[Worker]]
    ) -> RoutingObserver:
        """Register the series (once per registry) and pick the tracer."""
        if registry is not None:
            registry.add_collector(_WorkerGauges(workers))
            registry.add_collector(EngineSeries(workers))
        return cls(tracer=tracer or trace.get_tracer(semconv.INSTRUMENTATION_SCOPE), registry=registry)

    def decided(
        self,
        policy: str,
        decision: Decision,
        candidates: Sequence[Worker],
        excluded: int,
        prompt_tokens: int,
        tokenizer: str,
        seconds: float,
    ) -> Span | None:
        """Record one decision: counters, a histogram, and an INTERNAL span that `settled` ends."""
        worker_id = decision.worker.id
        if self.registry is not None:
            key = (policy, worker_id, decision.reason)
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = self._decision_series(self.registry, *key)
            series.decisions.inc()
            series.prompt_tokens.inc(prompt_tokens)
            series.match_tokens.inc(decision.match_tokens)
            series.seconds.observe(seconds)
        if not self._spans:
            return None
        span = self.tracer.start_span(semconv.ROUTING_SPAN_NAME, kind=SpanKind.INTERNAL)
        if span.is_recording():
            span.set_attributes(
                {
                    semconv.ROUTING_POLICY: policy,
                    semconv.ROUTING_WORKER_ID: worker_id,
                    semconv.ROUTING_REASON: decision.reason,
                    semconv.ROUTING_PROMPT_TOKENS: prompt_tokens,
                    semconv.ROUTING_MATCH_TOKENS: decision.match_tokens,
                    semconv.ROUTING_CANDIDATES: len(candidates),
                    semconv.ROUTING_EXCLUDED: excluded,
                    semconv.ROUTING_WORKER_LOADS: ",".join(f"{w.id}={w.queued_work:.0f}" for w in candidates),
                    semconv.ROUTING_TOKENIZER: tokenizer,
                    semconv.ROUTING_MATCH_SOURCE: decision.source,
                }
            )
        return span

    def settled(
        self, span: Span | None, worker_id: str, predicted: int | None, cached: int | None, *, failed: bool
    ) -> None:
        """Record one attempt's outcome: the engine's cached tokens against the prediction (in the
        engine's tokens), on the decision's span and in the prediction-error series."""
        if predicted is not None and cached is not None and self.registry is not None:
            self.registry.histogram(
                semconv.ROUTING_PREDICTION_ERROR_METRIC,
                "Absolute error of the routing tree's predicted cached prompt tokens against the "
                "engine's reported cached_tokens, per request.",
                ["worker"],
                buckets=ERROR_BUCKETS,
            ).labels(worker_id).observe(abs(predicted - cached))
            self.registry.counter(
                semconv.ROUTING_PREDICTED_CACHED_METRIC,
                "Prompt tokens the routing tree predicted cached (requests whose engine reported its own).",
                ["worker"],
            ).labels(worker_id).inc(predicted)
            self.registry.counter(
                semconv.ROUTING_REPORTED_CACHED_METRIC,
                "Prompt tokens the engine reported cached (usage cached_tokens).",
                ["worker"],
            ).labels(worker_id).inc(cached)
        if span is None:
            return
        if span.is_recording():
            span.set_attribute(semconv.ROUTING_OUTCOME, "failed" if failed else "ok")
            if cached is not None:
                span.set_attribute(semconv.ROUTING_CACHED_TOKENS, cached)
            if predicted is not None and cached is not None:
                span.set_attribute(semconv.ROUTING_PREDICTION_ERROR, predicted - cached)
        span.end()

    @staticmethod
    def _decision_series(
        registry: MetricsRegistry, policy: str, worker_id: str, reason: str
    ) -> _DecisionSeries:
        return _DecisionSeries(
            decisions=registry.counter(
                semconv.ROUTING_DECISIONS_METRIC,
                "Routing decisions by policy, worker and reason.",
                ["policy", "worker", "reason"],
            ).labels(policy, worker_id, reason),
            prompt_tokens=registry.counter(
                semconv.ROUTING_PROMPT_TOKENS_METRIC, "Prompt tokens routed per worker.", ["worker"]
            ).labels(worker_id),
            match_tokens=registry.counter(
                semconv.ROUTING_MATCH_TOKENS_METRIC,
                "Prompt tokens the worker's tree predicted cached.",
                ["worker"],
            ).labels(worker_id),
            seconds=registry.histogram(
                semconv.ROUTING_DECISION_SECONDS_METRIC,
                "Seconds per routing decision (tokenizing excluded).",
                ["policy"],
                buckets=DECISION_BUCKETS,
            ).labels(policy),
        )

    def failed(self, worker_id: str) -> None:
        """Count a failed attempt on a worker."""
        if self.registry is not None:
            self.registry.counter(
                semconv.ROUTING_FAILURES_METRIC, "Failed attempts per worker.", ["worker"]
            ).labels(worker_id).inc()

    def panicked(self, model: str, worker_id: str) -> None:
        """Count a request sent, in panic mode, to a worker marked down."""
        if self.registry is not None:
            self.registry.counter(
                semconv.ROUTING_PANIC_METRIC,
                "Requests tried on a worker marked down because every worker of the model was (panic mode).",
                ["model", "worker"],
            ).labels(model, worker_id).inc()

    def no_worker(self, model: str) -> None:
        """Count a request for which no worker was available."""
        if self.registry is not None:
            self.registry.counter(
                semconv.ROUTING_NO_WORKER_METRIC,
                "Requests refused because no worker was available.",
                ["model"],
            ).labels(model).inc()
