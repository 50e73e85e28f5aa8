"""The gRPC front door's overhead beside the HTTP one's, on one gateway, in the same session.

Starts the fast stub (`stub.py`, pinned with the load generators to `--client-cpu`) and
`radixgate serve --upstream STUB --grpc-port G` (pinned alone to `--gateway-cpu`), then, for
`--rounds` rounds, offers `--rate` requests/s four ways, the order rotating by round: straight at
the stub (HTTP `/v1/completions`, the baseline), through the gateway's HTTP `/v1/completions`, and
through its gRPC `ModelInfer` (`grpc_loadgen.py`, the same completion as tensors); and, as the
floor under any front door on `grpc.aio`, at an empty handler (`grpc_floor.py`, on the gateway's
CPU). Added p50 is a
path's p50 minus the baseline's of the same round; the gateway's CPU per request is the growth of
its utime+stime over a run divided by the run's requests. The gRPC figure includes the gRPC client's
own cost over the raw-protocol HTTP generator's, so it errs against gRPC.

    flock /tmp/rg-bench.lock python -m benchmarks.overhead.grpc_overhead --rounds 3 --duration 10

Results: a markdown table on stdout, every raw run in benchmarks/overhead/out/grpc-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.overhead.run import (
    OUT,
    PYTHON,
    ROOT,
    cpu_seconds,
    host,
    loadavg,
    start,
    wait_listening,
    wait_ready,
)

FLOOR_ADDED_P50_MS = 1.0
"""gRPC's added p50 may exceed HTTP's by at most this much (the issue's floor)."""
FLOOR_CPU_RATIO = 1.5
"""gRPC's gateway CPU per request may be at most this multiple of HTTP's."""
TARGETS = ("direct", "http", "grpc", "floor")
"""`floor`: the gRPC generator against `grpc_floor.py` (an empty `grpc.aio` handler) on the gateway's CPU."""


def load(args: argparse.Namespace, target: str) -> dict[str, Any]:
    timing = ["--rate", str(args.rate), "--duration", str(args.duration), "--warmup", str(args.warmup)]
    if target in ("grpc", "floor"):
        port = args.grpc_port if target == "grpc" else args.floor_port
        tool = ["-m", "benchmarks.overhead.grpc_loadgen", "--port", str(port)]
    else:
        port = args.stub_port if target == "direct" else args.gateway_port
        tool = ["-m", "benchmarks.overhead.loadgen", "--port", str(port), "--path", "/v1/completions"]
    command = ["taskset", "-c", args.client_cpu, PYTHON, *tool, *timing]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, check=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_rounds(args: argparse.Namespace, pids: dict[str, int]) -> list[dict[str, Any]]:
    runs = []
    for round_index in range(args.rounds):
        shift = round_index % len(TARGETS)
        for target in TARGETS[shift:] + TARGETS[:shift]:
            pid = pids["floor" if target == "floor" else "gateway"]
            cpu_before = cpu_seconds(pid)
            result = load(args, target)
            cpu = cpu_seconds(pid) - cpu_before
            result.update(target=target, round=round_index, cpu_s=cpu, load=loadavg())
            if target != "direct":
                result["cpu_ms_per_request"] = cpu * 1000 / result["requests"]
            runs.append(result)
            print(
                f"round {round_index} {target:6s} p50 {result['latency_ms']['p50']:7.3f} ms  "
                f"p99 {result['latency_ms']['p99']:7.3f} ms  errors {result['errors']}  "
                f"cpu {result.get('cpu_ms_per_request', 0):.3f} ms/req  load {result['load']}",
                file=sys.stderr,
                flush=True,
            )
    return runs


def summary(runs: list[dict[str, Any]], rounds: int) -> dict[str, float]:
    """Medians over rounds of each path's p50, added p50 (same-round baseline) and CPU per request."""
    by = {(run["round"], run["target"]): run for run in runs}
    figures: dict[str, float] = {}
    for target in TARGETS:
        figures[f"{target}_p50"] = statistics.median(
            by[r, target]["latency_ms"]["p50"] for r in range(rounds)
        )
        figures[f"{target}_p99"] = statistics.median(
            by[r, target]["latency_ms"]["p99"] for r in range(rounds)
        )
        if target != "direct":
            figures[f"{target}_added_p50"] = statistics.median(
                by[r, target]["latency_ms"]["p50"] - by[r, "direct"]["latency_ms"]["p50"]
                for r in range(rounds)
            )
            figures[f"{target}_cpu"] = statistics.median(
                by[r, target]["cpu_ms_per_request"] for r in range(rounds)
            )
    figures["added_p50_difference"] = figures["grpc_added_p50"] - figures["http_added_p50"]
    figures["grpc_cpu_above_floor"] = figures["grpc_cpu"] - figures["floor_cpu"]
    figures["cpu_ratio"] = figures["grpc_cpu"] / figures["http_cpu"]
    return figures


def table(figures: dict[str, float]) -> str:
    difference, ratio = figures["added_p50_difference"], figures["cpu_ratio"]
    lines = [
        "| path | p50 / p99 (ms) | added p50 (ms) | gateway CPU ms/req |",
        "|---|---|---|---|",
        f"| direct to the stub | {figures['direct_p50']:.3f} / {figures['direct_p99']:.3f} | | |",
    ]
    paths = (
        ("http", "HTTP `/v1/completions`"),
        ("grpc", "gRPC `ModelInfer`"),
        ("floor", "gRPC, an empty `grpc.aio` handler (`grpc_floor.py`)"),
    )
    for target, name in paths:
        lines.append(
            f"| {name} | {figures[f'{target}_p50']:.3f} / {figures[f'{target}_p99']:.3f} "
            f"| {figures[f'{target}_added_p50']:.3f} | {figures[f'{target}_cpu']:.3f} |"
        )
    lines += [
        "",
        f"gRPC added p50 - HTTP added p50: {difference:+.3f} ms (floor: <= {FLOOR_ADDED_P50_MS} ms): "
        f"{'met' if difference <= FLOOR_ADDED_P50_MS else 'NOT met'}",
        f"gRPC CPU per request / HTTP's: {ratio:.2f}x (floor: <= {FLOOR_CPU_RATIO}x): "
        f"{'met' if ratio <= FLOOR_CPU_RATIO else 'NOT met'}",
        f"gRPC CPU per request above the empty grpc.aio handler's: {figures['grpc_cpu_above_floor']:.3f} ms "
        f"(HTTP's whole path: {figures['http_cpu']:.3f} ms)",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--gateway-cpu", default="0")
    parser.add_argument("--client-cpu", default="1")
    parser.add_argument("--stub-port", type=int, default=9191)
    parser.add_argument("--gateway-port", type=int, default=9190)
    parser.add_argument("--grpc-port", type=int, default=9193)
    parser.add_argument("--floor-port", type=int, default=9194)
    args = parser.parse_args()

    stub = start(args.client_cpu, [PYTHON, "-m", "benchmarks.overhead.stub", "--port", str(args.stub_port)])
    upstream = f"http://127.0.0.1:{args.stub_port}"
    command = [
        str(ROOT / ".venv/bin/radixgate"),
        *("serve", "--upstream", upstream, "--model", "stub-model", "--log-level", "warning"),
        *("--port", str(args.gateway_port), "--grpc-port", str(args.grpc_port)),
    ]
    gateway = start(args.gateway_cpu, command)
    floor = start(
        args.gateway_cpu, [PYTHON, "-m", "benchmarks.overhead.grpc_floor", "--port", str(args.floor_port)]
    )
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        wait_ready(f"http://127.0.0.1:{args.gateway_port}/health/ready")
        wait_listening(args.floor_port)
        runs = run_rounds(args, {"gateway": gateway.pid, "floor": floor.pid})
    finally:
        for process in (gateway, floor, stub):
            process.terminate()
            process.wait(30)
    figures = summary(runs, args.rounds)
    OUT.mkdir(exist_ok=True)
    record = {
        "started": started,
        "host": host(),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "gateway_command": " ".join(shlex.quote(a) for a in command),
        "summary": figures,
        "runs": runs,
    }
    (OUT / f"grpc-{time.strftime('%Y%m%dT%H%M%S')}.json").write_text(json.dumps(record, indent=2))
    print(f"{started}, {host()}\n")
    print(table(figures))


if __name__ == "__main__":
    main()
