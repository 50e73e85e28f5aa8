"""The response cache through the real gateway (`radixgate serve`, a separate process) in front of a
fast upstream stub, measured end to end over HTTP/1.1 keep-alive on loopback.

Latency (one client, requests back to back, p50/p90/p99 of request write -> last byte):

    hit             the same deterministic request every time: answered from L1 memory
    hit (L3 dir)    the same, with `--cache-dir` set (only reads that must touch the disk leave the loop)
    disk hit        three requests in turn with L1 and L2 capped at one entry: each comes from L3
    miss            a new deterministic request every time: stub call, then stored
    bypass          the same sampled request every time (temperature 0.7): the stub answers

Throughput with no reuse at all (closed loop, `--concurrency` clients, every request new and
deterministic, so each is a lookup, a miss, a stub call and a store), against the same gateway with
`[cache] response_cache = false`; plus sampled requests with the cache on (the decision only). All
gateways stay up and short bursts rotate between them, so drift on a shared machine hits every variant
alike; medians over bursts are reported, with the gateway's CPU time per request from /proc/<pid>/stat.

The cache step alone: `ResponseCacheStep` in this process in front of an instant upstream, CPU time
per request on each path, and the extra over "cache off" as a share of the gateway CPU a forwarded
request costs (the throughput baseline above), which is what the cache adds when nothing is reused.

    python -m benchmarks.cache.bench_response_cache [--rounds 12] [--duration 2] [--concurrency 16]

The no-reuse floor (cache on >= 0.95x of cache off) is measured by `benchmarks.cache.bench_no_reuse`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvloop

from benchmarks.cache.step_cost import MODEL, step_rows
from benchmarks.overhead.loadgen import Connection, Sample, percentiles
from benchmarks.overhead.run import PYTHON, ROOT, cpu_seconds, start, wait_ready

GATEWAY_CPU = "1"
CLIENT_CPU = "0"
"""The gateway alone on one core; the stub and this client on the other."""

DISABLED = "[cache]\nresponse_cache = false\n"
ENABLED = ""
DISK_ONLY_MEMORY = "[kv_cache]\nl1_capacity = 1\nl2_capacity = 1\n"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def request_bytes(port: int, content: str, temperature: float) -> bytes:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 16,
            "temperature": temperature,
        },
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


Payloads = Callable[[int], bytes]
"""Request number -> the raw request to send."""


def same(port: int, temperature: float = 0.0) -> Payloads:
    fixed = request_bytes(port, "Say something short about foxes.", temperature)
    return lambda _: fixed


def unique(port: int, tag: str) -> Payloads:
    return lambda number: request_bytes(port, f"Say something short about fox {tag}-{number}.", 0.0)


def rotating(port: int, count: int) -> Payloads:
    payloads = [request_bytes(port, f"Say something short about fox #{i}.", 0.0) for i in range(count)]
    return lambda number: payloads[number % count]


@dataclass(slots=True)
class Run:
    requests: int
    errors: int
    seconds: float
    latencies: list[float]
    cpu_s: float

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_us_per_request(self) -> float:
        return 1e6 * self.cpu_s / max(self.requests, 1)


async def _closed_loop(
    pid: int, port: int, payloads: Payloads, concurrency: int, duration: float, warmup: float
) -> Run:
    loop = asyncio.get_running_loop()
    counter = itertools.count()
    samples: list[Sample] = []
    started = time.perf_counter()
    measure_from = started + warmup
    stop = measure_from + duration
    cpu: list[float] = []  # the gateway's CPU seconds when the measured window opens and closes
    loop.call_later(warmup, lambda: cpu.append(cpu_seconds(pid)))
    loop.call_later(warmup + duration, lambda: cpu.append(cpu_seconds(pid)))

    async def client() -> None:
        waiter: asyncio.Future[None] | None = None

        def done(_: Connection, sample: Sample) -> None:
            samples.append(sample)
            assert waiter is not None
            waiter.set_result(None)

        _, conn = await loop.create_connection(lambda: Connection(done, lambda _: None), "127.0.0.1", port)
        while time.perf_counter() < stop:
            waiter = loop.create_future()
            conn.send(payloads(next(counter)), Sample(due=time.perf_counter()))
            await waiter
        if conn.transport is not None:
            conn.transport.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    measured = [s for s in samples if measure_from <= s.done <= stop]  # answered inside the window
    ok = [s for s in measured if s.status == 200]
    latencies = [s.done - s.sent for s in ok]
    return Run(len(measured), len(measured) - len(ok), duration, latencies, cpu[1] - cpu[0])


def load(pid: int, port: int, payloads: Payloads, concurrency: int, duration: float, warmup: float) -> Run:
    """Run the load from this process: the requests answered in the measured window, and its CPU."""
    return uvloop.run(_closed_loop(pid, port, payloads, concurrency, duration, warmup))


@contextmanager
def gateway(
    stub_port: int,
    config: str,
    cache_dir: Path | None = None,
    cpu: str = GATEWAY_CPU,
    tree: Path | None = None,
    venv: Path | None = None,
) -> Iterator[tuple[int, int]]:
    """`radixgate serve` pinned to `cpu` with `config` as its radixgate.toml, importing the code in
    `tree` (another checkout, first on `PYTHONPATH`; None: this one), run by the interpreter of the
    virtual environment `venv` (None: this checkout's `.venv`); yields (pid, port)."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as scratch:
        toml = Path(scratch) / "radixgate.toml"
        toml.write_text(config)
        command = [str((venv or ROOT / ".venv") / "bin/radixgate"), "serve", "--config", str(toml)]
        command += ["--upstream", f"http://127.0.0.1:{stub_port}", "--model", MODEL]
        command += ["--port", str(port), "--log-level", "warning"]
        if cache_dir is not None:
            command += ["--cache-dir", str(cache_dir)]
        process = start(cpu, command, {"PYTHONPATH": str(tree.resolve())} if tree is not None else None)
        try:
            wait_ready(f"http://127.0.0.1:{port}/health/ready")
            yield process.pid, port
        finally:
            process.terminate()
            process.wait(30)


def outcome(port: int, payload: bytes) -> str:
    """The x-radixgate-cache header one request gets (to check a scenario does what it says)."""
    body = payload.split(b"\r\n\r\n", 1)[1]
    response = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    seen: str = response.headers.get("x-radixgate-cache", "?")
    return seen


def latency_rows(args: argparse.Namespace, stub_port: int, workdir: Path) -> tuple[list[str], float]:
    """The rows, and the gateway CPU per request with the cache off (one client)."""
    rows = []
    off_cpu = 0.0
    scenarios: list[tuple[str, str, Path | None, Callable[[int], Payloads], str]] = [
        ("hit (L1 memory)", ENABLED, None, lambda p: same(p), "hit"),
        ("hit, L3 configured", ENABLED, workdir / "l3-a", lambda p: same(p), "hit"),
        (
            "disk hit (L1/L2 hold 1 entry, 3 rotating)",
            DISK_ONLY_MEMORY,
            workdir / "l3-b",
            lambda p: rotating(p, 3),
            "hit",
        ),
        ("miss to the stub (new request each time)", ENABLED, None, lambda p: unique(p, "lat"), "miss"),
        ("bypass to the stub (sampled)", ENABLED, None, lambda p: same(p, 0.7), "bypass"),
        ("cache off, same request", DISABLED, None, lambda p: same(p), "bypass"),
    ]
    for name, config, cache_dir, make, expected in scenarios:
        with gateway(stub_port, config, cache_dir) as (pid, port):
            payloads = make(port)
            for number in range(4):  # fill the cache (three rotating entries, or one)
                outcome(port, payloads(number))
            seen = outcome(port, payloads(4))
            assert seen == expected, f"{name}: expected {expected}, got {seen}"
            run = load(pid, port, payloads, 1, args.latency_duration, args.warmup)
        p = percentiles(run.latencies, (50, 90, 99))
        if config == DISABLED:
            off_cpu = run.cpu_us_per_request
        rows.append(
            f"| {name} | {seen} | {len(run.latencies)} | {p['p50']:.3f} | {p['p90']:.3f} | {p['p99']:.3f} "
            f"| {run.cpu_us_per_request:.0f} |"
        )
    return rows, off_cpu


def throughput_rows(args: argparse.Namespace, stub_port: int, workdir: Path) -> tuple[list[str], float]:
    """Closed-loop bursts, rotating between gateways that all stay up (only one has load at a time),
    so drift on the shared machine hits every variant alike. Returns the rows and the baseline's
    gateway CPU per request."""
    variants: list[tuple[str, str, Path | None, Callable[[int, str], Payloads]]] = [
        ("cache off (baseline)", DISABLED, None, unique),
        ("cache on, every request new and deterministic", ENABLED, None, unique),
        ("cache on + L3 dir, every request new", ENABLED, workdir / "l3-t", unique),
        ("cache on, sampled requests (bypass)", ENABLED, None, lambda p, _: same(p, 0.7)),
    ]
    results: dict[str, list[Run]] = {name: [] for name, *_ in variants}
    with ExitStack() as stack:
        running = [
            (name, *stack.enter_context(gateway(stub_port, config, cache_dir)), make)
            for name, config, cache_dir, make in variants
        ]
        for burst in range(args.rounds):
            shift = burst % len(running)
            for name, pid, port, make in running[shift:] + running[:shift]:
                payloads = make(port, f"b{burst}")
                results[name].append(load(pid, port, payloads, args.concurrency, args.duration, args.warmup))
    baseline = statistics.median(r.throughput for r in results[variants[0][0]])
    baseline_cpu = statistics.median(r.cpu_us_per_request for r in results[variants[0][0]])
    rows = []
    for name, runs in results.items():
        rps = statistics.median(r.throughput for r in runs)
        cpu = statistics.median(r.cpu_us_per_request for r in runs)
        p50 = statistics.median(percentiles(r.latencies, (50,))["p50"] for r in runs)
        errors = sum(r.errors for r in runs)
        spread = f"{min(r.throughput for r in runs):.0f}-{max(r.throughput for r in runs):.0f}"
        rows.append(
            f"| {name} | {rps:.0f} ({spread}) | {rps / baseline:.3f} | {cpu:.0f} "
            f"| {cpu / baseline_cpu:.3f} | {p50:.2f} | {errors} |"
        )
    return rows, baseline_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="throughput bursts per variant (interleaved)")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per throughput burst")
    parser.add_argument("--latency-duration", type=float, default=4.0, help="seconds per latency run")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds left out at the start of a run")
    parser.add_argument("--concurrency", type=int, default=16, help="clients in the throughput runs")
    parser.add_argument("--step-requests", type=int, default=3000, help="requests per in-process step run")
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(CLIENT_CPU)})  # this process is the load generator: off the gateway's core
    stub_port = _free_port()
    stub = start(CLIENT_CPU, [PYTHON, "-m", "benchmarks.overhead.stub", "--port", str(stub_port)])
    try:
        time.sleep(1.0)
        with tempfile.TemporaryDirectory() as scratch:
            workdir = Path(scratch)
            print(
                "| scenario (1 client, back to back) | x-radixgate-cache | requests | p50 ms | p90 ms "
                "| p99 ms | gateway CPU us/req |"
            )
            print("|---|---|---|---|---|---|---|")
            rows, off_cpu_one_client = latency_rows(args, stub_port, workdir)
            for row in rows:
                print(row, flush=True)
            print()
            print(
                f"| no reuse, {args.concurrency} clients closed loop | req/s median (min-max) | vs off "
                "| gateway CPU us/req | vs off | p50 ms | errors |"
            )
            print("|---|---|---|---|---|---|---|")
            rows, gateway_cpu_us = throughput_rows(args, stub_port, workdir)
            for row in rows:
                print(row, flush=True)
            print()
            print(
                "| cache step alone (in-process, instant upstream) | CPU us/req | vs cache off "
                "| share of a forwarded request's gateway CPU (cache off, the lower of the two above) |"
            )
            print("|---|---|---|---|")
            # The smaller of the two measured costs of a forwarded request: the larger share.
            for row in step_rows(args, min(gateway_cpu_us, off_cpu_one_client), workdir):
                print(row, flush=True)
    finally:
        stub.terminate()
        stub.wait(10)


if __name__ == "__main__":
    main()
