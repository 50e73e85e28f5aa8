"""Two builds of the gateway at once on one core: which one costs less CPU per request (A/B).

The fast upstream stub and this process (closed-loop load) run on `--client-cpu`; two `radixgate
serve` processes, A and B, both pinned to `--gateway-cpu`, each with its own `--concurrency`
closed-loop clients, so the scheduler shares the core between them and any drift of the machine
(other jobs, the host) charges both in the same seconds. A runs the code in `--a-tree` (a directory
holding another checkout's `proxy`, `cachelayer` and `adapters`, put first on `PYTHONPATH`); B runs
this checkout. Both read the same `--config`. Per round: the two throughputs and CPU per request
(utime+stime from /proc over the measured window); the verdict is the median of the per-round B/A
ratios. Run with both builds equal (`--a-tree .`) to see the method's own bias.

    git archive HEAD~1 | tar -x -C /tmp/rg-a          # the baseline build
    python -m benchmarks.overhead.paired_ab --a-tree /tmp/rg-a [--rounds 8] [--duration 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

import uvloop

from benchmarks.cache.bench_response_cache import Run, _closed_loop, _free_port, gateway, load, unique
from benchmarks.overhead.run import PYTHON, start


async def both(a: tuple[int, int], b: tuple[int, int], tag: str, args: argparse.Namespace) -> list[Run]:
    """One measured round: both gateways under their own closed-loop clients at the same time."""
    c, seconds, warmup = args.concurrency, args.duration, args.warmup
    loops = (_closed_loop(pid, port, unique(port, tag), c, seconds, warmup) for pid, port in (a, b))
    return list(await asyncio.gather(*loops))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-tree", type=Path, required=True, help="checkout whose code gateway A runs")
    parser.add_argument("--config", default="", help="radixgate.toml text of both gateways")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per round")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--fill", type=float, default=3.0, help="unmeasured load per gateway first (s)")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients per gateway")
    parser.add_argument("--gateway-cpu", default="1")
    parser.add_argument("--client-cpu", default="0")
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cpu.split(",")})
    print(f"start: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; load {os.getloadavg()}")
    stub_port = _free_port()
    stub = start(args.client_cpu, [PYTHON, "-m", "benchmarks.overhead.stub", "--port", str(stub_port)])
    rounds: list[tuple[Run, Run]] = []
    try:
        time.sleep(1.0)
        with ExitStack() as stack:
            a = stack.enter_context(gateway(stub_port, args.config, cpu=args.gateway_cpu, tree=args.a_tree))
            b = stack.enter_context(gateway(stub_port, args.config, cpu=args.gateway_cpu))
            for pid, port in (a, b):
                load(pid, port, unique(port, "fill"), args.concurrency, args.fill, 0.0)
            print("| round | A req/s | B req/s | A CPU us/req | B CPU us/req | B/A req/s | B/A CPU us/req |")
            print("|---|---|---|---|---|---|---|")
            for number in range(args.rounds):
                run_a, run_b = uvloop.run(both(a, b, f"r{number}", args))
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
