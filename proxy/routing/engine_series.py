"""The embedded engine's own figures as Prometheus series, read at scrape time (vLLM and SGLang
export the same from their `/metrics`):

    radixgate_engine_running_sequences{worker}          sequences being generated now
    radixgate_engine_waiting_sequences{worker}          sequences queued for admission
    radixgate_engine_kv_usage_ratio{worker}             KV pool pages in use, 0..1
    radixgate_engine_preemptions_total{worker}          sequences pushed back to free pages
    radixgate_engine_evicted_tokens_total{worker}       cached tokens evicted from the prefix cache
    radixgate_engine_prefix_hit_tokens_total{worker}    prompt tokens served from the prefix cache
    radixgate_engine_prefix_query_tokens_total{worker}  prompt tokens looked up in it
    radixgate_engine_queue_time_seconds{worker}         submission to first admission (histogram)
    radixgate_engine_inter_token_latency_seconds{worker}  gap between two tokens of a sequence
    radixgate_engine_speculative_draft_tokens_total{worker,source}     draft tokens verified
    radixgate_engine_speculative_accepted_tokens_total{worker,source}  draft tokens accepted
    radixgate_engine_speculative_verify_steps_total{worker}            sequence-steps that verified a draft
    radixgate_engine_speculative_emitted_tokens_total{worker}          tokens those steps emitted
    radixgate_engine_speculative_early_stops_total{worker}             drafts rejected before their end
    radixgate_engine_window_kv_pages{worker}            KV pages running windowed sequences hold
    radixgate_engine_window_utilization_ratio{worker}   those pages against the most they may hold
    radixgate_engine_window_hits_total{worker}          windowed prompts whose kept cache was reused
    radixgate_engine_window_misses_total{worker}        windowed prompts that computed it from scratch
    radixgate_engine_window_evicted_pages_total{worker}  pages slid out of windows, back to the pool
    radixgate_engine_window_offloaded_total{worker}     kept windows saved to the L2/L3 offload tiers
    radixgate_engine_window_offload_hits_total{worker}  kept windows loaded back from them

Engines that report no such figures (remote workers, whose own `/metrics` has them) add nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from adapters.engine_stats import LatencyFigures
from proxy.routing.worker import Worker
from proxy.telemetry.prometheus import METRIC_PREFIX


@runtime_checkable
class EngineFigures(Protocol):
    """What `adapters.local.EngineStats` holds (matched by attributes, so torch is never imported)."""

    running: int
    waiting: int
    preemptions: int
    evicted_tokens: int
    cache_hit_tokens: int
    cache_query_tokens: int
    pool_pages_total: int
    pool_pages_free: int
    queue_time: LatencyFigures
    inter_token_latency: LatencyFigures
    window_hits: int
    window_misses: int
    window_slid_pages: int
    window_pages: int
    window_capacity_pages: int
    window_kept_pages: int
    window_offloaded: int
    window_loaded: int


class SourceCounts(Protocol):
    drafts: int
    drafted_tokens: int
    accepted_tokens: int


class EngineSpeculation(Protocol):
    """What `adapters.local.drafts.SpeculationFigures` holds (matched by attributes, no torch import)."""

    verify_steps: int
    drafted_tokens: int
    accepted_tokens: int
    tokens_generated: int
    early_stops: int
    sources: tuple[tuple[str, SourceCounts], ...]


@runtime_checkable
class _ReportsSpeculation(Protocol):
    speculation: EngineSpeculation | None
    beam_searches: int
    beam_early_stops: int


def engine_speculation(engine: object) -> EngineSpeculation | None:
    """An engine's speculation figures, None when it reports none."""
    figures = _speculating(engine)
    return figures.speculation if figures is not None else None


def engine_beam_searches(engine: object) -> tuple[int, int]:
    """An engine's beam searches and those that stopped early ((0, 0) when it reports none)."""
    figures = _speculating(engine)
    return (figures.beam_searches, figures.beam_early_stops) if figures is not None else (0, 0)


def _speculating(engine: object) -> _ReportsSpeculation | None:
    stats = getattr(engine, "stats", None)
    figures = stats() if callable(stats) else None
    return figures if isinstance(figures, _ReportsSpeculation) else None


_GAUGES: tuple[tuple[str, str, Callable[[EngineFigures], float]], ...] = (
    ("engine_running_sequences", "Sequences the engine is generating now.", lambda f: f.running),
    ("engine_waiting_sequences", "Sequences waiting for admission.", lambda f: f.waiting),
    (
        "engine_kv_usage_ratio",
        "Fraction of the KV pool's pages in use (running sequences and the prefix cache).",
        lambda f: (
            (f.pool_pages_total - f.pool_pages_free) / f.pool_pages_total if f.pool_pages_total else 0.0
        ),
    ),
    ("engine_window_kv_pages", "KV pages running windowed sequences hold.", lambda f: f.window_pages),
    (
        "engine_window_utilization_ratio",
        "KV pages running windowed sequences hold against the most they may hold, 0..1.",
        lambda f: f.window_pages / f.window_capacity_pages if f.window_capacity_pages else 0.0,
    ),
)


def _query_tokens(figures: EngineFigures) -> float:
    return figures.cache_query_tokens


_COUNTERS: tuple[tuple[str, str, Callable[[EngineFigures], float]], ...] = (
    ("engine_preemptions", "Sequences pushed back to the queue to free KV pages.", lambda f: f.preemptions),
    ("engine_evicted_tokens", "Cached tokens evicted from the prefix cache.", lambda f: f.evicted_tokens),
    ("engine_prefix_hit_tokens", "Prompt tokens served from the prefix cache.", lambda f: f.cache_hit_tokens),
    (
        "engine_prefix_query_tokens",
        "Prompt tokens looked up in the prefix cache.",
        lambda f: f.cache_query_tokens,
    ),
    (
        "engine_window_hits",
        "Windowed prompts whose kept cache started from cached pages.",
        lambda f: f.window_hits,
    ),
    ("engine_window_misses", "Windowed prompts that computed their kept cache.", lambda f: f.window_misses),
    (
        "engine_window_evicted_pages",
        "KV pages that slid out of sliding windows, back to the pool.",
        lambda f: f.window_slid_pages,
    ),
    (
        "engine_window_offloaded",
        "Kept windows saved to the L2/L3 offload tiers.",
        lambda f: f.window_offloaded,
    ),
    (
        "engine_window_offload_hits",
        "Kept windows loaded back from the offload tiers.",
        lambda f: f.window_loaded,
    ),
)
_HISTOGRAMS: tuple[tuple[str, str, Callable[[EngineFigures], LatencyFigures]], ...] = (
    ("engine_queue_time_seconds", "Seconds from submission to first admission.", lambda f: f.queue_time),
    (
        "engine_inter_token_latency_seconds",
        "Seconds between two consecutive tokens of one sequence.",
        lambda f: f.inter_token_latency,
    ),
)


class EngineSeries:
    """A collector over the workers whose engine reports `EngineFigures` (the embedded engine)."""

    def __init__(self, workers: Callable[[], Iterable[Worker]]) -> None:
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        reporting = [(worker.id, figures) for worker in self._workers() if (figures := _figures(worker))]
        for name, documentation, read in _GAUGES:
            gauge = GaugeMetricFamily(METRIC_PREFIX + name, documentation, labels=["worker"])
            for worker_id, figures in reporting:
                gauge.add_metric([worker_id], float(read(figures)))
            yield gauge
        for name, documentation, read in _COUNTERS:
            counter = CounterMetricFamily(METRIC_PREFIX + name, documentation, labels=["worker"])
            for worker_id, figures in reporting:
                counter.add_metric([worker_id], float(read(figures)))
            yield counter
        yield from _speculation_series(
            [
                (worker.id, f)
                for worker in self._workers()
                if (f := engine_speculation(worker.engine)) is not None
            ]
        )
        for name, documentation, read_latency in _HISTOGRAMS:
            histogram = HistogramMetricFamily(METRIC_PREFIX + name, documentation, labels=["worker"])
            for worker_id, figures in reporting:
                latency = read_latency(figures)
                histogram.add_metric([worker_id], latency.cumulative(), latency.sum)
            yield histogram


_SPECULATION_COUNTERS: tuple[tuple[str, str, Callable[[EngineSpeculation], float]], ...] = (
    (
        "engine_speculative_verify_steps",
        "Sequence-steps that verified a speculative draft.",
        lambda f: f.verify_steps,
    ),
    (
        "engine_speculative_emitted_tokens",
        "Tokens the verifying steps emitted (accepted drafts plus the model's own next token).",
        lambda f: f.tokens_generated,
    ),
    ("engine_speculative_early_stops", "Drafts rejected before their end.", lambda f: f.early_stops),
)


def _speculation_series(reporting: list[tuple[str, EngineSpeculation]]) -> Iterator[Metric]:
    """Speculative decoding's counters: per worker, and the draft tokens per worker and source."""
    for name, documentation, read in _SPECULATION_COUNTERS:
        counter = CounterMetricFamily(METRIC_PREFIX + name, documentation, labels=["worker"])
        for worker_id, figures in reporting:
            counter.add_metric([worker_id], float(read(figures)))
        yield counter
    drafted = CounterMetricFamily(
        METRIC_PREFIX + "engine_speculative_draft_tokens",
        "Speculative draft tokens verified.",
        labels=["worker", "source"],
    )
    accepted = CounterMetricFamily(
        METRIC_PREFIX + "engine_speculative_accepted_tokens",
        "Speculative draft tokens the model agreed with.",
        labels=["worker", "source"],
    )
    for worker_id, figures in reporting:
        for source, counts in figures.sources:
            drafted.add_metric([worker_id, source], float(counts.drafted_tokens))
            accepted.add_metric([worker_id, source], float(counts.accepted_tokens))
    yield drafted
    yield accepted


def _figures(worker: Worker) -> EngineFigures | None:
    stats = getattr(worker.engine, "stats", None)
    figures = stats() if callable(stats) else None
    return figures if isinstance(figures, EngineFigures) else None
