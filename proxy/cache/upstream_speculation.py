"""Per-worker rows of `speculation.upstream` in `GET /v1/cache/stats`: SGLang's and vLLM's own figures.

The health checker reads them from each worker's `/metrics` with its load
(`adapters.spec_metrics`, kept as `Worker.engine_speculation`). vLLM's are counters, so they fold
into the headline sums (`upstream_totals`); SGLang's are recent averages (tokens per verification
step, fraction accepted) that cannot be added to counts, so they stay in their worker's row.
The Prometheus side needs nothing from the gateway: each engine exports these series itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from proxy.cache.radix_stats import percent
from proxy.routing.worker import Worker


class UpstreamSpeculationStats(msgspec.Struct, kw_only=True):
    worker: str
    engine: str
    """Whose series these are: `vllm` or `sglang`."""
    drafts: int | None = None
    """Draft rounds verified (vLLM `spec_decode_num_drafts_total`)."""
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    hit_rate: float | None = None
    """Percentage of draft tokens accepted (vLLM: from the counters; SGLang: `spec_accept_rate`)."""
    avg_depth: float | None = None
    """Draft tokens accepted per draft round (vLLM)."""
    accept_length: float | None = None
    """SGLang's `spec_accept_length`: tokens per verification step, the model's own included."""


class UpstreamTotals(msgspec.Struct, kw_only=True):
    """What the counting workers (vLLM) add to the headline figures."""

    accepted: int = 0
    drafted: int = 0
    steps: int = 0
    stepped_accepted: int = 0
    """Accepted tokens of the rows that count their rounds (older vLLM has no drafts counter)."""
    tokens: int = 0


def upstream_rows(workers: Iterable[Worker]) -> list[UpstreamSpeculationStats]:
    """One row per worker whose engine reported speculative figures at its last health check."""
    rows = []
    for worker in workers:
        spec = worker.engine_speculation
        if spec is None:
            continue
        drafted, accepted, drafts = spec.drafted_tokens, spec.accepted_tokens, spec.drafts
        rate: float | None
        if drafted is not None and accepted is not None:
            rate = percent(accepted / drafted) if drafted else 0.0
        else:
            rate = percent(spec.accept_rate) if spec.accept_rate is not None else None
        depth = round(accepted / drafts, 3) if accepted is not None and drafts else None
        rows.append(
            UpstreamSpeculationStats(
                worker=worker.id,
                engine=spec.engine,
                drafts=drafts,
                drafted_tokens=drafted,
                accepted_tokens=accepted,
                hit_rate=rate,
                avg_depth=depth,
                accept_length=spec.accept_length,
            )
        )
    return rows


def upstream_totals(rows: Iterable[UpstreamSpeculationStats]) -> UpstreamTotals:
    """Sums over the rows with counts; a round emits its accepted drafts plus the model's own token."""
    totals = UpstreamTotals()
    for row in rows:
        if row.drafted_tokens is None or row.accepted_tokens is None:
            continue
        totals.accepted += row.accepted_tokens
        totals.drafted += row.drafted_tokens
        if row.drafts is not None:
            totals.steps += row.drafts
            totals.stepped_accepted += row.accepted_tokens
            totals.tokens += row.accepted_tokens + row.drafts
    return totals
