"""Reading SGLang's and vLLM's speculative-decoding series from their Prometheus text."""

from __future__ import annotations

from adapters.spec_metrics import UpstreamSpeculation, sglang_speculation, vllm_speculation
from proxy.cache.upstream_speculation import UpstreamSpeculationStats, upstream_totals

VLLM = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
"""


def test_vllm_counters_are_summed_over_engine_cores() -> None:
    assert vllm_speculation(VLLM) == UpstreamSpeculation(
        engine="vllm", drafts=10, drafted_tokens=30, accepted_tokens=12
    )


def test_a_worker_without_spec_decode_series_reports_none() -> None:
    plain = 'vllm:num_requests_running{model_name="m"} 1.0\nsglang:num_running_reqs 2.0\n'
    assert vllm_speculation(plain) is None
    assert sglang_speculation(plain) is None


def test_sglang_gauges_under_either_prefix() -> None:
    old = 'sglang:spec_accept_length{model_name="m",tp_rank="0"} 3.5\n'
    assert sglang_speculation(old) == UpstreamSpeculation(engine="sglang", accept_length=3.5)
    new = "sglang_spec_accept_length 2.0\nsglang_spec_accept_rate 0.25\n"
    assert sglang_speculation(new) == UpstreamSpeculation(
        engine="sglang", accept_length=2.0, accept_rate=0.25
    )


def test_rounds_count_only_where_the_engine_counts_them() -> None:
    """An older vLLM without the drafts counter adds to hits and misses, not to the per-round depth."""
    rows = [
        UpstreamSpeculationStats(worker="new", engine="vllm", drafts=4, drafted_tokens=12, accepted_tokens=8),
        UpstreamSpeculationStats(worker="old", engine="vllm", drafted_tokens=10, accepted_tokens=5),
        UpstreamSpeculationStats(worker="sg", engine="sglang", hit_rate=50.0, accept_length=2.5),
    ]
    totals = upstream_totals(rows)
    assert (totals.accepted, totals.drafted) == (13, 22)
    assert (totals.steps, totals.stepped_accepted, totals.tokens) == (4, 8, 12)
