"""Two builds of the gateway at once on one core: which one costs less CPU per request (A/B).

The fast upstream stub and this process (closed-loop load) run on `--client-cpu`; two `radixgate
serve` processes, A and B, both pinned to `--gateway-cpu`, each with its own `--concurrency`
closed-loop clients, so the scheduler shares the core between them and any drift of the machine
(other jobs, the host) charges both in the same seconds. A runs the code in `--a-tree` (a directory
holding another checkout's `proxy`, `cachelayer` and `adapters`, put first on `PYTHONPATH`); B runs
this checkout. Both read the same `--config`. Per round: the two throughputs and CPU per request
(utime+stime from /proc over the measured window); the verdict is the median of the per-round B/A
ratios. Run with both builds equal (`--a-tree .`) to see the method's own bias; with `--a-tree .` and
`--a-venv`/`--b-venv` naming two virtual environments, the same code on two interpreters.

With `--rate R` each gateway gets an open loop of R requests/s instead (one gateway's requests half an
interval after the other's, which one alternating by round) of `run.py`'s request (sampled, so the
response cache passes it on), so at a low rate every request wakes an idle process as in `run.py`'s
100 and 300 req/s scenarios: the CPU per request then includes what a cold wake costs, which
saturation hides. CPU time then comes from the scheduler's per-thread counters (nanoseconds).
Both gateways loaded at once evict each other's caches and TLB entries between requests, which
favours a build with a smaller memory footprint more than a gateway alone on its core would; with
`--alone` each round loads A alone, then B alone (the order alternating), as `run.py` does.

    git archive HEAD~1 | tar -x -C /tmp/rg-a          # the baseline build
    python -m benchmarks.overhead.paired_ab --a-tree /tmp/rg-a [--rounds 8] [--duration 4]
    python -m benchmarks.overhead.paired_ab --a-tree /tmp/rg-a --rate 100 [--alone] --duration 10 \
        --rounds 6 --gateway-cpu 0 --client-cpu 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import uvloop

from benchmarks.cache.bench_response_cache import (
    Payloads,
    Run,
    _closed_loop,
    _free_port,
    gateway,
    load,
    unique,
)
from benchmarks.overhead.loadgen import ANSWER_TIMEOUT_S, DEFAULT_MODEL, Connection, Sample, request_bytes
from benchmarks.overhead.run import PYTHON, host, start

OPEN_LOOP_CONNECTIONS = 8
"""Keep-alive connections an open-loop client opens first (more only if all are busy)."""


def _sampled(port: int) -> Payloads:
    """`run.py`'s request: no temperature (1.0 by default), so the response cache lets it through."""
    payload = request_bytes("127.0.0.1", port, "/v1/chat/completions", DEFAULT_MODEL, stream=False)
    return lambda _: payload


def run_time(pid: int) -> float:
    """Seconds on a CPU of every thread of `pid` (the scheduler's nanosecond count, where /proc's
    utime+stime come in 10 ms ticks: too coarse for a few hundred requests at a low rate)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


async def both(a: tuple[int, int], b: tuple[int, int], number: int, args: argparse.Namespace) -> list[Run]:
    """One measured round: both gateways under their own load (at the same time unless `--alone`)."""
    c, seconds, warmup, tag = args.concurrency, args.duration, args.warmup, f"r{number}"
    if args.rate and args.alone:
        # One gateway at a time, as `run.py` runs it; which one goes first alternates by round.
        first, second = (a, b) if number % 2 == 0 else (b, a)
        runs = {}
        for pid, port in (first, second):
            runs[port] = await _open_loop(pid, port, _sampled(port), args.rate, seconds, 0.0)
        return [runs[a[1]], runs[b[1]]]
    if args.rate:
        # Which gateway's requests come first alternates by round.
        offsets = (0.0, 0.5 / args.rate) if number % 2 == 0 else (0.5 / args.rate, 0.0)
        opened = (
            _open_loop(pid, port, _sampled(port), args.rate, seconds, offset)
            for (pid, port), offset in zip((a, b), offsets, strict=True)
        )
        return list(await asyncio.gather(*opened))
    loops = (_closed_loop(pid, port, unique(port, tag), c, seconds, warmup) for pid, port in (a, b))
    return list(await asyncio.gather(*loops))


async def _open_loop(
    pid: int, port: int, payloads: Payloads, rate: float, duration: float, offset: float
) -> Run:
    """Request i due at `start + offset + i / rate` on an idle keep-alive connection (a new one when
    none is idle); the gateway's CPU from the first request to the last answer."""
    loop = asyncio.get_running_loop()
    idle: list[Connection] = []
    samples: list[Sample] = []
    total = int(rate * duration)
    finished = loop.create_future()

    def done(conn: Connection, sample: Sample) -> None:
        samples.append(sample)
        idle.append(conn)
        if len(samples) == total and not finished.done():
            finished.set_result(None)

    def lost(conn: Connection) -> None:  # the server closed an idle keep-alive connection
        if conn in idle:
            idle.remove(conn)

    async def connect() -> Connection:
        _, conn = await loop.create_connection(lambda: Connection(done, lost), "127.0.0.1", port)
        return conn

    idle += [await connect() for _ in range(OPEN_LOOP_CONNECTIONS)]
    await asyncio.sleep(0.05 + offset)
    cpu_before = run_time(pid)
    start = time.perf_counter()
    for number in range(total):
        due = start + number / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        conn = idle.pop() if idle else await connect()
        conn.send(payloads(number), Sample(due=due))
    await asyncio.wait_for(finished, ANSWER_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    cpu = run_time(pid) - cpu_before
    for conn in idle:
        if conn.transport is not None:
            conn.transport.close()
    ok = [s for s in samples if s.status == 200]
    return Run(len(samples), len(samples) - len(ok), elapsed, [s.done - s.sent for s in ok], cpu)


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in this process's environment (which a gateway started now inherits), then as before."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-tree", type=Path, required=True, help="checkout whose code gateway A runs")
    parser.add_argument("--config", default="", help="radixgate.toml text of both gateways")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per round")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--fill", type=float, default=3.0, help="unmeasured load per gateway first (s)")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients per gateway")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="open loop: requests/s per gateway (0: closed loop)"
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="with --rate: load one gateway at a time (the other idles), alternating, not both at once",
    )
    parser.add_argument(
        "--b-env", action="append", default=[], metavar="NAME=VALUE", help="an environment variable of B only"
    )
    parser.add_argument(
        "--a-venv",
        type=Path,
        help="virtual environment whose interpreter runs A (default: this checkout's .venv)",
    )
    parser.add_argument("--b-venv", type=Path, help="the same for B")
    parser.add_argument("--gateway-cpu", default="1")
    parser.add_argument("--client-cpu", default="0")
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cpu.split(",")})
    print(f"start: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; load {os.getloadavg()}")
    print(f"host: {host()}")
    stub_port = _free_port()
    stub = start(args.client_cpu, [PYTHON, "-m", "benchmarks.overhead.stub", "--port", str(stub_port)])
    rounds: list[tuple[Run, Run]] = []
    try:
        time.sleep(1.0)
        with ExitStack() as stack:
            a = stack.enter_context(
                gateway(stub_port, args.config, cpu=args.gateway_cpu, tree=args.a_tree, venv=args.a_venv)
            )
            with _environment(dict(item.split("=", 1) for item in args.b_env)):  # only B's process sees it
                b = stack.enter_context(
                    gateway(stub_port, args.config, cpu=args.gateway_cpu, venv=args.b_venv)
                )
            for pid, port in (a, b):
                load(pid, port, unique(port, "fill"), args.concurrency, args.fill, 0.0)
            print("| round | A req/s | B req/s | A CPU us/req | B CPU us/req | B/A req/s | B/A CPU us/req |")
            print("|---|---|---|---|---|---|---|")
            for number in range(args.rounds):
                run_a, run_b = uvloop.run(both(a, b, number, args))
                rounds.append((run_a, run_b))
                print(
                    f"| {number} | {run_a.throughput:.0f} | {run_b.throughput:.0f} "
                    f"| {run_a.cpu_us_per_request:.0f} | {run_b.cpu_us_per_request:.0f} "
                    f"| {run_b.throughput / run_a.throughput:.3f} "
                    f"| {run_b.cpu_us_per_request / run_a.cpu_us_per_request:.3f} |",
                    flush=True,
                )
    finally:
        stub.terminate()
        stub.wait(10)
    rps = [b.throughput / a.throughput for a, b in rounds]
    cpu = [b.cpu_us_per_request / a.cpu_us_per_request for a, b in rounds]
    errors = sum(a.errors + b.errors for a, b in rounds)
    print(
        f"\nmedian B/A: req/s {statistics.median(rps):.3f} ({min(rps):.3f}-{max(rps):.3f}), "
        f"CPU us/req {statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}); "
        f"A {statistics.median(a.cpu_us_per_request for a, _ in rounds):.0f} us/req, "
        f"B {statistics.median(b.cpu_us_per_request for _, b in rounds):.0f} us/req; errors {errors}"
    )
    print(f"end: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
