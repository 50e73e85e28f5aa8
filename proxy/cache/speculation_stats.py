"""`cache_manager.speculation` of `GET /v1/cache/stats`: the embedded engines' speculative decoding.

Summed over every worker whose engine reports speculation figures (`adapters.local.EngineStats`):
`hits` and `misses` are draft tokens accepted and rejected, `hit_rate` their percentage accepted,
`tokens_generated` the tokens verification steps emitted (accepted drafts plus the model's own next
token), `avg_depth` draft tokens accepted per verification step, `early_stops` drafts rejected
before their end plus beam searches that stopped before `max_tokens` (`beam_searches`,
`beam_early_stops` count those apart); `sources` splits the drafts by where they came from
(`radix`: the prefix cache's tree, `prompt`: prompt lookup). `upstream` lists the SGLang and vLLM
workers that report their own speculation on `/metrics` (`proxy.cache.upstream_speculation`);
vLLM's counters are added to `hits`, `misses`, `tokens_generated`, `verify_steps` and `avg_depth`.
"""

from __future__ import annotations

import msgspec

from proxy.cache.config import SpeculativeConfig
from proxy.cache.radix_stats import percent
from proxy.cache.upstream_speculation import UpstreamSpeculationStats, upstream_rows, upstream_totals
from proxy.routing.engine_series import engine_beam_searches, engine_speculation
from proxy.routing.pool import WorkerPool

NOT_REPORTED = (
    "no worker's engine reports speculative decoding (the embedded engine does; SGLang and vLLM "
    "do on /metrics when they speculate)"
)


class DraftSourceStats(msgspec.Struct, kw_only=True):
    source: str
    drafts: int
    drafted_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    """Percentage of this source's draft tokens accepted."""


class SpeculationStats(msgspec.Struct, kw_only=True):
    implemented: bool
    """True when a worker's engine reports speculation (the embedded one, or SGLang/vLLM metrics)."""
    note: str = ""
    hits: int = 0
    misses: int = 0
    hit_rate: float = 0.0
    tokens_generated: int = 0
    avg_depth: float = 0.0
    early_stops: int = 0
    verify_steps: int = 0
    beam_searches: int = 0
    beam_early_stops: int = 0
    sources: list[DraftSourceStats] = msgspec.field(default_factory=list)
    upstream: list[UpstreamSpeculationStats] = msgspec.field(default_factory=list)
    configured: SpeculativeConfig


def speculation_stats(router: WorkerPool, configured: SpeculativeConfig) -> SpeculationStats:
    """Every reporting engine's counters, summed."""
    workers = router.workers()
    reports = [f for w in workers if (f := engine_speculation(w.engine)) is not None]
    beams = [engine_beam_searches(w.engine) for w in workers]
    searches, beam_early = sum(b[0] for b in beams), sum(b[1] for b in beams)
    upstream = upstream_rows(workers)
    if not reports and not upstream:
        return SpeculationStats(implemented=False, note=NOT_REPORTED, configured=configured)
    counted = upstream_totals(upstream)
    drafted = sum(f.drafted_tokens for f in reports) + counted.drafted
    embedded_accepted = sum(f.accepted_tokens for f in reports)
    accepted = embedded_accepted + counted.accepted
    steps = sum(f.verify_steps for f in reports) + counted.steps
    by_source: dict[str, list[int]] = {}
    for figures in reports:
        for name, counts in figures.sources:
            total = by_source.setdefault(name, [0, 0, 0])
            total[0] += counts.drafts
            total[1] += counts.drafted_tokens
            total[2] += counts.accepted_tokens
    return SpeculationStats(
        implemented=True,
        hits=accepted,
        misses=drafted - accepted,
        hit_rate=percent(accepted / drafted) if drafted else 0.0,
        tokens_generated=sum(f.tokens_generated for f in reports) + counted.tokens,
        avg_depth=round((embedded_accepted + counted.stepped_accepted) / steps, 3) if steps else 0.0,
        early_stops=sum(f.early_stops for f in reports) + beam_early,
        verify_steps=steps,
        beam_searches=searches,
        beam_early_stops=beam_early,
        sources=[
            DraftSourceStats(
                source=name,
                drafts=drafts,
                drafted_tokens=tokens,
                accepted_tokens=hits,
                acceptance_rate=percent(hits / tokens) if tokens else 0.0,
            )
            for name, (drafts, tokens, hits) in by_source.items()
        ],
        upstream=upstream,
        configured=configured,
    )
