"""The routing benchmark's medians over replays (`benchmarks.routing.report.median_rows`)."""

from __future__ import annotations

from benchmarks.routing.report import Row, markdown, median_rows


def _row(
    router: str, throughput: float, p99: float | None, failures: int = 0, workload: str = "multi_turn"
) -> Row:
    return Row(
        workload=workload,
        router=router,
        requests=100,
        failures=failures,
        wall_s=1000 / throughput,
        throughput_tok_s=throughput,
        engine_throughput_tok_s=throughput / 10,
        ttft_p50_s=0.01,
        ttft_p99_s=p99,
        latency_p50_s=0.2,
        latency_p99_s=0.3,
        hit_rate=0.9,
        max_min_load=1.0,
        per_worker_requests=[throughput, 0.0],
        first_error=None,
        router_cpu_ms_per_request=None if router == "oracle-sticky" else 1.0,
        workers_cpu_s=1.0,
        client_cpu_s=1.0,
    )


def test_each_figure_is_the_median_of_its_replays_and_lists_come_from_the_median_replay() -> None:
    rows = [
        _row("radixgate-round_robin", 100.0, 0.05),
        _row("radixgate-cache_aware", 120.0, 0.10, failures=1),
        _row("radixgate-round_robin", 90.0, 0.07),
        _row("radixgate-cache_aware", 80.0, 0.02),
        _row("radixgate-round_robin", 110.0, 0.03),
        _row("radixgate-cache_aware", 100.0, 0.03, failures=2),
    ]
    merged = median_rows(rows)
    assert [r.router for r in merged] == ["radixgate-round_robin", "radixgate-cache_aware"]
    rr, ca = merged
    assert (rr.throughput_tok_s, rr.ttft_p99_s, rr.rounds) == (100.0, 0.05, 3)
    assert (ca.throughput_tok_s, ca.ttft_p99_s, ca.failures) == (100.0, 0.03, 3)
    assert ca.per_worker_requests == [100.0, 0.0]  # the replay of median throughput
    table = markdown(merged)
    assert "(medians of 3 replays)" in table
    assert "| radixgate-cache_aware | 90.0% | 100 | 1.00 |" in table


def test_a_figure_missing_in_every_replay_stays_missing_and_one_replay_is_left_as_it_is() -> None:
    oracle = [_row("oracle-sticky", 100.0, None), _row("oracle-sticky", 50.0, None)]
    (merged,) = median_rows(oracle)
    assert merged.ttft_p99_s is None and merged.router_cpu_ms_per_request is None
    assert merged.throughput_tok_s == 75.0 and merged.per_worker_requests == [50.0, 0.0]
    single = _row("radixgate-round_robin", 100.0, 0.05, workload="no_sharing")
    assert median_rows([single]) == [single]
    assert "medians" not in markdown([single])
