"""The routing benchmark's rows and its Markdown table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from benchmarks.routing.cluster import WorkerCounters
from benchmarks.routing.load import RunResult


@dataclass(slots=True)
class Row:
    workload: str
    router: str
    requests: int
    failures: int
    wall_s: float
    throughput_tok_s: float
    engine_throughput_tok_s: float
    """Output tokens per simulated second of the busiest worker: the wall-clock-free view."""
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    hit_rate: float
    max_min_load: float
    per_worker_requests: list[float]
    first_error: str | None
    router_cpu_ms_per_request: float | None
    """CPU the router process spent per request (None for the oracle, which has no router)."""
    workers_cpu_s: float
    client_cpu_s: float
    ttft_max_by_turn: list[float] | None = None
    """Multi-turn only: the slowest first token of each turn (where the TTFT tail comes from)."""
    trees: list[dict[str, object]] | None = None
    """radixgate only: per worker, its routing tree and prediction accuracy (from /admin/workers)."""
    rounds: int = 1
    """How many replays this row's figures are the medians of (`median_rows`)."""


@dataclass(slots=True)
class Cpu:
    router: float | None
    workers: float
    client: float


def summarize(
    workload: str, router: str, result: RunResult, counters: Sequence[WorkerCounters], cpu: Cpu
) -> Row:
    prompt = sum(c.prompt_tokens for c in counters)
    cached = sum(c.cached_tokens for c in counters)
    loads = [c.requests for c in counters]
    return Row(
        workload=workload,
        router=router,
        requests=len(result.outcomes),
        failures=result.failures,
        wall_s=round(result.wall_s, 2),
        throughput_tok_s=round(result.throughput, 1),
        engine_throughput_tok_s=round(result.output_tokens / max(c.busy_s for c in counters), 1),
        ttft_p50_s=result.ttft_percentile(0.5),
        ttft_p99_s=result.ttft_percentile(0.99),
        latency_p50_s=result.latency_percentile(0.5),
        latency_p99_s=result.latency_percentile(0.99),
        hit_rate=round(cached / prompt, 4) if prompt else 0.0,
        max_min_load=round(max(loads) / min(loads), 2) if min(loads) > 0 else float("inf"),
        per_worker_requests=loads,
        first_error=next((o.error for o in result.outcomes if o.error is not None), None),
        router_cpu_ms_per_request=None
        if cpu.router is None
        else round(cpu.router * 1e3 / len(result.outcomes), 2),
        workers_cpu_s=round(cpu.workers, 1),
        client_cpu_s=round(cpu.client, 1),
        ttft_max_by_turn=_max_by_turn(result),
    )


def _max_by_turn(result: RunResult) -> list[float] | None:
    slowest: dict[int, float] = {}
    for o in result.outcomes:
        if o.turn is not None and o.ttft_s is not None:
            slowest[o.turn] = max(slowest.get(o.turn, 0.0), round(o.ttft_s, 3))
    return [slowest[turn] for turn in sorted(slowest)] or None


_MEDIAN_FIELDS = (
    "wall_s",
    "throughput_tok_s",
    "engine_throughput_tok_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "latency_p50_s",
    "latency_p99_s",
    "hit_rate",
    "max_min_load",
    "router_cpu_ms_per_request",
    "workers_cpu_s",
    "client_cpu_s",
)


def median_rows(rows: Sequence[Row]) -> list[Row]:
    """One row per (workload, router), in first-seen order: each figure the median over its replays
    (a wall-clock tail on a shared two-core host moves several-fold between back-to-back replays), failures
    summed, and the lists (spread, slowest turns, trees) from the replay of median throughput."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.workload, row.router), []).append(row)
    merged = []
    for group in groups.values():
        if len(group) == 1:
            merged.append(group[0])
            continue
        by_throughput = sorted(group, key=lambda r: r.throughput_tok_s)
        middle = by_throughput[(len(group) - 1) // 2]
        medians = {name: _median([getattr(r, name) for r in group]) for name in _MEDIAN_FIELDS}
        merged.append(replace(middle, **medians, failures=sum(r.failures for r in group), rounds=len(group)))
    return merged


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def _pair(p50: float | None, p99: float | None) -> str:
    return "-" if p50 is None or p99 is None else f"{p50:.2f} / {p99:.2f}"


def markdown(rows: Sequence[Row]) -> str:
    """One table per workload; ratios are against radixgate's round_robin in the same run.
    TTFT is measured on the streamed multi-turn workload only."""
    lines = []
    for workload in dict.fromkeys(r.workload for r in rows):
        group = [r for r in rows if r.workload == workload]
        base = next((r for r in group if r.router == "radixgate-round_robin"), group[0])
        rounds = max(r.rounds for r in group)
        lines += [
            f"\n#### {workload}" + (f" (medians of {rounds} replays)" if rounds > 1 else "") + "\n",
            "| router | hit rate | tok/s (wall) | x RR | tok/engine-s | x RR | TTFT p50/p99 s "
            "| latency p50/p99 s | max/min load | router CPU ms/req | failed |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in group:
            wall = r.throughput_tok_s / base.throughput_tok_s if base.throughput_tok_s else float("nan")
            engine = r.engine_throughput_tok_s / base.engine_throughput_tok_s
            cpu = "-" if r.router_cpu_ms_per_request is None else r.router_cpu_ms_per_request
            lines.append(
                f"| {r.router} | {r.hit_rate:.1%} | {r.throughput_tok_s:.0f} | {wall:.2f} | "
                f"{r.engine_throughput_tok_s:.0f} | {engine:.2f} | {_pair(r.ttft_p50_s, r.ttft_p99_s)} | "
                f"{_pair(r.latency_p50_s, r.latency_p99_s)} | {r.max_min_load:.2f} | "
                f"{cpu} | {r.failures} |"
            )
    return "\n".join(lines)
