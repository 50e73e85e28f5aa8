"""Gateway overhead, interleaved with a direct-to-stub baseline in the same session.

Starts the upstream stub (pinned with the load generator to `--client-cpu`) and the gateway
(pinned alone to `--gateway-cpu`), then, for `--rounds` rounds, runs every scenario twice, once
straight at the stub and once through the gateway, alternating which goes first so drift
cancels. Each load-generator run is its own process. The gateway's CPU time per request is the
growth of utime+stime in /proc/<pid>/stat over a run, divided by the requests of that run.

    python -m benchmarks.overhead.run                      # the issue's scenarios, 3 rounds
    python -m benchmarks.overhead.run --server granian     # another ASGI server, same app
    python -m benchmarks.overhead.run --scenarios open300 --rounds 1 --duration 5

Results: a markdown table on stdout, every raw run in benchmarks/overhead/out/<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "out"
PYTHON = sys.executable
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Scenario:
    name: str
    args: tuple[str, ...]
    description: str


SCENARIOS = {
    "open100": Scenario("open100", ("--rate", "100"), "100 req/s, non-streaming"),
    "open300": Scenario("open300", ("--rate", "300"), "300 req/s, non-streaming"),
    "open1000": Scenario("open1000", ("--rate", "1000"), "1,000 req/s, non-streaming"),
    "stream100": Scenario("stream100", ("--rate", "100", "--stream"), "100 streams/s of 20 chunks"),
    "closed64": Scenario("closed64", ("--concurrency", "64"), "64 concurrent clients, closed loop"),
}


def cpu_seconds(pid: int) -> float:
    """utime + stime, in seconds, of a process and all its descendants (granian forks workers)."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        for task in Path(f"/proc/{current}/task").iterdir():
            children = (task / "children").read_text().split()
            pending.extend(int(child) for child in children)
    return total


def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become ready")


def start(cpu: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["taskset", "-c", cpu, *command],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def gateway_command(args: argparse.Namespace) -> list[str]:
    upstream = f"http://127.0.0.1:{args.stub_port}"
    if args.server == "cli":
        return [
            str(ROOT / ".venv/bin/radixgate"),
            "serve",
            "--upstream",
            upstream,
            "--model",
            "stub-model",
            "--port",
            str(args.gateway_port),
            "--log-level",
            "warning",
        ]
    return [
        PYTHON,
        "-m",
        "benchmarks.overhead.serve",
        "--server",
        args.server,
        "--upstream",
        upstream,
        "--port",
        str(args.gateway_port),
        "--app",
        args.app,
        "--client",
        args.client,
    ]


def load(args: argparse.Namespace, port: int, scenario: Scenario) -> dict[str, Any]:
    command = [
        "taskset",
        "-c",
        args.client_cpu,
        PYTHON,
        "-m",
        "benchmarks.overhead.loadgen",
        "--port",
        str(port),
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        *scenario.args,
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, check=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def run_rounds(args: argparse.Namespace, gateway_pid: int) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        for scenario_name in args.scenarios:
            scenario = SCENARIOS[scenario_name]
            targets = ["direct", "gateway"] if round_index % 2 == 0 else ["gateway", "direct"]
            for target in targets:
                port = args.stub_port if target == "direct" else args.gateway_port
                cpu_before = cpu_seconds(gateway_pid)
                result = load(args, port, scenario)
                cpu = cpu_seconds(gateway_pid) - cpu_before
                result.update(
                    scenario=scenario_name,
                    target=target,
                    round=round_index,
                    gateway_cpu_s=cpu,
                    load=loadavg(),
                )
                if target == "gateway" and result["requests"]:
                    result["gateway_cpu_ms_per_request"] = cpu * 1000 / result["requests"]
                runs.append(result)
                print(
                    f"round {round_index} {scenario_name:9s} {target:7s} "
                    f"p50 {result['latency_ms'].get('p50', float('nan')):8.3f} ms  "
                    f"ttfc p50 {result['ttfc_ms'].get('p50', float('nan')):8.3f} ms  "
                    f"{result['throughput_rps']:8.1f} req/s  errors {result['errors']}  "
                    f"cpu {result.get('gateway_cpu_ms_per_request', 0):.3f} ms/req  load {result['load']}",
                    file=sys.stderr,
                    flush=True,
                )
    return runs


def _median(runs: list[dict[str, Any]], *path: str) -> float:
    values = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value.get(key, {}) if isinstance(value, dict) else {}
        if isinstance(value, int | float):
            values.append(float(value))
    return statistics.median(values) if values else float("nan")


def table(runs: list[dict[str, Any]], scenarios: list[str]) -> str:
    lines = [
        "| scenario | direct p50 / p99 (ms) | gateway p50 / p99 (ms) | added p50 / p99 (ms) "
        "| direct TTFC p50 | gateway TTFC p50 | added TTFC p50 | gateway req/s | gateway CPU ms/req "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in scenarios:
        direct = [r for r in runs if r["scenario"] == name and r["target"] == "direct"]
        gateway = [r for r in runs if r["scenario"] == name and r["target"] == "gateway"]
        d50, d99 = _median(direct, "latency_ms", "p50"), _median(direct, "latency_ms", "p99")
        g50, g99 = _median(gateway, "latency_ms", "p50"), _median(gateway, "latency_ms", "p99")
        dt, gt = _median(direct, "ttfc_ms", "p50"), _median(gateway, "ttfc_ms", "p50")
        errors = sum(r["errors"] for r in gateway)
        lines.append(
            f"| {SCENARIOS[name].description} | {d50:.3f} / {d99:.3f} | {g50:.3f} / {g99:.3f} "
            f"| {g50 - d50:.3f} / {g99 - d99:.3f} | {dt:.3f} | {gt:.3f} | {gt - dt:.3f} "
            f"| {_median(gateway, 'throughput_rps'):.0f} "
            f"| {_median(gateway, 'gateway_cpu_ms_per_request'):.3f} "
            f"| {errors} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("cli", "uvicorn", "granian"), default="cli")
    parser.add_argument(
        "--app",
        choices=("gateway", "static", "framework", "bare"),
        default="gateway",
        help="with --server uvicorn|granian: the gateway, or layers of it answering without an upstream "
        "(static: Litestar + telemetry; framework: Litestar; bare: a plain ASGI callable)",
    )
    parser.add_argument(
        "--client",
        choices=("fast", "httpx", "asyncio-backend"),
        default="fast",
        help="with --server uvicorn|granian: the upstream client transport (see serve.py); with --server cli "
        "use --gateway-env RADIXGATE_UPSTREAM_CLIENT__TRANSPORT=httpx",
    )
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--gateway-cpu", default="0")
    parser.add_argument("--client-cpu", default="1")
    parser.add_argument("--stub-port", type=int, default=9181)
    parser.add_argument("--gateway-port", type=int, default=9180)
    parser.add_argument("--chunk-interval-ms", type=float, default=5.0)
    parser.add_argument("--gateway-env", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    stub = start(
        args.client_cpu,
        [
            PYTHON,
            "-m",
            "benchmarks.overhead.stub",
            "--port",
            str(args.stub_port),
            "--chunk-interval-ms",
            str(args.chunk_interval_ms),
        ],
    )
    env = dict(item.split("=", 1) for item in args.gateway_env)
    command = gateway_command(args)
    gateway = start(args.gateway_cpu, command, env)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        wait_ready(f"http://127.0.0.1:{args.gateway_port}/health/ready")
        load_before = loadavg()
        runs = run_rounds(args, gateway.pid)
        load_after = loadavg()
    finally:
        for process in (gateway, stub):
            process.terminate()
        for process in (gateway, stub):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    OUT.mkdir(exist_ok=True)
    record = {
        "started": started,
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "gateway_command": " ".join(shlex.quote(a) for a in command),
        "gateway_env": env,
        "load_before": load_before,
        "load_after": load_after,
        "runs": runs,
    }
    label = args.server if args.server == "cli" else f"{args.server}-{args.app}-{args.client}"
    path = OUT / f"{time.strftime('%Y%m%d-%H%M%S')}-{label}.json"
    path.write_text(json.dumps(record, indent=1))
    print(f"started {started}; load {load_before} -> {load_after}; raw runs in {path.relative_to(ROOT)}")
    print(table(runs, args.scenarios))


if __name__ == "__main__":
    main()
