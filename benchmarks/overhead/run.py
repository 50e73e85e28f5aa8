"""Gateway overhead, interleaved with a direct-to-stub baseline in the same session.

Starts the upstream stub (pinned with the load generator to `--client-cpu`) and the gateway
(pinned alone to `--gateway-cpu`), then, for `--rounds` rounds, runs every scenario twice, once
straight at the stub and once through the gateway, alternating which goes first so drift
cancels. Each load-generator run is its own process. The gateway's CPU time per request is the
growth of utime+stime in /proc/<pid>/stat over a run, divided by the requests of that run.

    python -m benchmarks.overhead.run                      # the issue's scenarios, 3 rounds
    python -m benchmarks.overhead.run --server granian     # another ASGI server, same app
    python -m benchmarks.overhead.run --scenarios open300 --rounds 1 --duration 5
    python -m benchmarks.overhead.run --baseline-relay     # also a byte relay (byte_relay.py), same rounds

With `--baseline-relay`, a byte relay pinned to the gateway's CPU takes its turn in every round too,
and a second table gives the gateway's CPU per request as a ratio to the relay's: the least a Python
proxy pays on this host, so the ratio holds across hosts where the absolute figure does not.

Results: a markdown table on stdout, every raw run in benchmarks/overhead/out/<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
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


def wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


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


def host() -> str:
    """The CPU model and its caches, for the record: a session's host can change, and the gateway's
    CPU per request changes with it (`benchmarks/RESULTS.md`, "## overhead")."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        caches.append(f"L{level}{kind[0].lower() if kind != 'Unified' else ''} {size}")
    return f"{model} ({os.cpu_count()} CPUs; {', '.join(caches)}); Python {sys.version.split()[0]}"


def run_rounds(args: argparse.Namespace, pids: dict[str, int]) -> list[dict[str, Any]]:
    """Every scenario against each target in turn ("direct" = the stub; the others by `pids`), the
    order rotating by round. `cpu_s` is the CPU time of the target's process over its run (during a
    direct run, the idle gateway's); `cpu_ms_per_request` that per request, for the proxies."""
    runs: list[dict[str, Any]] = []
    ports = {"direct": args.stub_port, "gateway": args.gateway_port, "relay": args.relay_port}
    names = ["direct", *pids]
    for round_index in range(args.rounds):
        for scenario_name in args.scenarios:
            scenario = SCENARIOS[scenario_name]
            shift = round_index % len(names)
            targets = names[shift:] + names[:shift]
            for target in targets:
                port = ports[target]
                pid = pids.get(target, pids["gateway"])
                cpu_before = cpu_seconds(pid)
                result = load(args, port, scenario)
                cpu = cpu_seconds(pid) - cpu_before
                result.update(
                    scenario=scenario_name,
                    target=target,
                    round=round_index,
                    cpu_s=cpu,
                    load=loadavg(),
                )
                if target != "direct" and result["requests"]:
                    result["cpu_ms_per_request"] = cpu * 1000 / result["requests"]
                runs.append(result)
                print(
                    f"round {round_index} {scenario_name:9s} {target:7s} "
                    f"p50 {result['latency_ms'].get('p50', float('nan')):8.3f} ms  "
                    f"ttfc p50 {result['ttfc_ms'].get('p50', float('nan')):8.3f} ms  "
                    f"{result['throughput_rps']:8.1f} req/s  errors {result['errors']}  "
                    f"cpu {result.get('cpu_ms_per_request', 0):.3f} ms/req  load {result['load']}",
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
            f"| {_median(gateway, 'cpu_ms_per_request'):.3f} "
            f"| {errors} |"
        )
    return "\n".join(lines)


def relay_table(runs: list[dict[str, Any]], scenarios: list[str]) -> str:
    """The gateway against the byte relay of the same rounds: what each adds, CPU per request, ratio."""
    lines = [
        "| scenario | relay added p50 (ms) | gateway added p50 (ms) | relay CPU ms/req | gateway CPU ms/req "
        "| gateway / relay CPU |",
        "|---|---|---|---|---|---|",
    ]
    for name in scenarios:
        medians = {}
        for target in ("direct", "relay", "gateway"):
            chosen = [r for r in runs if r["scenario"] == name and r["target"] == target]
            medians[target] = (
                _median(chosen, "latency_ms", "p50"),
                _median(chosen, "cpu_ms_per_request"),
            )
        (direct, _), (relay, relay_cpu), (gateway, gateway_cpu) = medians.values()
        lines.append(
            f"| {SCENARIOS[name].description} | {relay - direct:.3f} | {gateway - direct:.3f} "
            f"| {relay_cpu:.3f} | {gateway_cpu:.3f} | {gateway_cpu / relay_cpu:.2f} |"
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
    parser.add_argument("--baseline-relay", action="store_true", help="also measure a byte relay (see above)")
    parser.add_argument("--relay-port", type=int, default=9182)
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
    processes = [gateway, stub]
    pids = {"gateway": gateway.pid}
    if args.baseline_relay:
        relay_command = ["--port", str(args.relay_port), "--upstream-port", str(args.stub_port)]
        relay = start(args.gateway_cpu, [PYTHON, "-m", "benchmarks.overhead.byte_relay", *relay_command])
        processes.append(relay)
        pids["relay"] = relay.pid
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        wait_ready(f"http://127.0.0.1:{args.gateway_port}/health/ready")
        if args.baseline_relay:
            wait_listening(args.relay_port)
        load_before = loadavg()
        runs = run_rounds(args, pids)
        load_after = loadavg()
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    OUT.mkdir(exist_ok=True)
    record = {
        "started": started,
        "host": host(),
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
    print(f"host: {record['host']}")
    print(table(runs, args.scenarios))
    if args.baseline_relay:
        print()
        print(relay_table(runs, args.scenarios))


if __name__ == "__main__":
    main()
