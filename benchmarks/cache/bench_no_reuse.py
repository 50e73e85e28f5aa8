"""What the response cache costs when nothing is ever reused: the gateway with the cache on against
the same gateway with it off, every request new, throughput bound by the gateway's one core.

Setup: the fast upstream stub (`benchmarks.overhead.stub`) and this process (the closed-loop load
generator) on `--client-cpu`; two `radixgate serve` processes, default configuration (`development`
preset, memory tiers), one with `[cache] response_cache = false`, both pinned alone to
`--gateway-cpu`. Both stay up; only one has load at a time. Every request is a new deterministic
chat request (temperature 0, a counter in the prompt), so with the cache on each is a key, a lookup
that misses, a stub call, and a store (which, once L1 and L2 are full, also evicts and demotes).

Before measuring, each gateway gets `--fill` seconds of the same load (unmeasured), so the cache is
in its steady state (full tiers, evicting on every store) rather than filling. Then `--rounds`
rounds, each one burst per gateway, the order alternating (off,on / on,off / ...) so a drift of the
machine within a round charges both alike. Per round: the ratio of the two bursts' throughputs and
of their gateway CPU per request (utime+stime from /proc over the burst's measured window). The
verdict is the median of the per-round ratios; every round is printed so the spread is visible.
Each burst also prints the gateway's CPU use over the window (near 1.0 = the core was saturated).

`--paired` measures the same two gateways at the same time instead: both pinned to the one core,
each with its own `--concurrency` closed-loop clients, so the scheduler gives each about half of
that core and every drift of the machine hits both alike. A round's ratio is then the two gateways'
throughputs in the same seconds (and their CPU per request); with equal CPU shares the throughput
ratio is the inverse of the CPU-per-request ratio, which is the figure that does not depend on the
shares.

    python -m benchmarks.cache.bench_no_reuse [--rounds 8] [--duration 4] [--concurrency 32] [--paired]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvloop

from benchmarks.cache.bench_response_cache import (
    DISABLED,
    ENABLED,
    Payloads,
    Run,
    _closed_loop,
    _free_port,
    gateway,
    load,
    outcome,
    unique,
)
from benchmarks.overhead.loadgen import percentiles
from benchmarks.overhead.run import PYTHON, start

FLOOR = 0.95
"""The issue's floor: with no reuse, cache-on throughput >= 95% of cache-off."""


@dataclass(slots=True)
class Burst:
    variant: str
    round: int
    run: Run
    duration: float

    @property
    def busy(self) -> float:
        """The gateway's CPU seconds per wall second over the measured window."""
        return self.run.cpu_s / self.duration

    def row(self) -> str:
        p50 = percentiles(self.run.latencies, (50,)).get("p50", float("nan"))
        return (
            f"| {self.round} | {self.variant} | {self.run.requests} | {self.run.throughput:.0f} "
            f"| {self.run.cpu_us_per_request:.0f} | {self.busy:.2f} | {p50:.2f} | {self.run.errors} |"
        )


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds; each is one burst per gateway")
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per burst")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds left out at a burst's start")
    parser.add_argument("--fill", type=float, default=6.0, help="unmeasured load per gateway first (s)")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    parser.add_argument(
        "--on-config",
        default=ENABLED,
        help="radixgate.toml text of the cache-on gateway (default: empty)",
    )
    parser.add_argument(
        "--aa-control",
        action="store_true",
        help="A/A control: the 'on' gateway runs with the cache off too (shows the method's own bias)",
    )
    parser.add_argument(
        "--paired", action="store_true", help="load both gateways at once on the one core (see above)"
    )
    parser.add_argument("--gateway-cpu", default="1")
    parser.add_argument("--client-cpu", default="0")
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cpu.split(",")})  # the load generator
    print(f"start: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {uptime()}")
    stub_port = _free_port()
    stub = start(args.client_cpu, [PYTHON, "-m", "benchmarks.overhead.stub", "--port", str(stub_port)])
    on_config, on_outcome = (DISABLED, "bypass") if args.aa_control else (args.on_config, "miss")
    variants: list[tuple[str, str, str]] = [("off", DISABLED, "bypass"), ("on", on_config, on_outcome)]
    bursts: list[Burst] = []
    try:
        time.sleep(1.0)
        with (
            gateway(stub_port, DISABLED, cpu=args.gateway_cpu) as off,
            gateway(stub_port, on_config, cpu=args.gateway_cpu) as on,
        ):
            running = {"off": off, "on": on}
            for name, _, expected in variants:
                pid, port = running[name]
                payloads = unique(port, "check")
                seen = outcome(port, payloads(0))
                assert seen == expected, f"cache {name}: expected {expected}, got {seen}"
                load(pid, port, unique(port, "fill"), args.concurrency, args.fill, 0.0)

            def burst(name: str, number: int, make: Callable[[int, str], Payloads]) -> Burst:
                pid, port = running[name]
                run = load(pid, port, make(port, f"r{number}"), args.concurrency, args.duration, args.warmup)
                return Burst(name, number, run, args.duration)

            for number in range(args.rounds):
                if args.paired:
                    bursts += paired_round(running, number, args)
                    print(bursts[-2].row(), bursts[-1].row(), sep="\n", flush=True)
                    continue
                order = ("off", "on") if number % 2 == 0 else ("on", "off")
                for name in order:
                    bursts.append(burst(name, number, unique))
                    print(bursts[-1].row(), flush=True)
    finally:
        stub.terminate()
        stub.wait(10)
    print(f"end: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {uptime()}")
    report(bursts, args)


def paired_round(running: dict[str, tuple[int, int]], number: int, args: argparse.Namespace) -> list[Burst]:
    """One burst of both gateways at the same time, each with its own clients."""

    async def both() -> list[Run]:
        return list(
            await asyncio.gather(
                *(
                    _closed_loop(
                        pid, port, unique(port, f"p{number}"), args.concurrency, args.duration, args.warmup
                    )
                    for pid, port in (running["off"], running["on"])
                )
            )
        )

    off, on = uvloop.run(both())
    return [Burst("off", number, off, args.duration), Burst("on", number, on, args.duration)]


def report(bursts: list[Burst], args: argparse.Namespace) -> None:
    print()
    mode = "both gateways at once on one core" if args.paired else "one gateway at a time"
    print(
        f"No reuse: {args.concurrency} closed-loop clients per gateway, {args.rounds} rounds of "
        f"{args.duration:g} s, {mode}"
    )
    print()
    print("| round | cache | requests | req/s | gateway CPU us/req | gateway CPU busy | p50 ms | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for item in bursts:
        print(item.row())
    print()
    print("| round | on/off req/s | on/off CPU us/req |")
    print("|---|---|---|")
    rps_ratios, cpu_ratios = [], []
    for number in range(args.rounds):
        pair = {b.variant: b.run for b in bursts if b.round == number}
        rps = pair["on"].throughput / pair["off"].throughput
        cpu = pair["on"].cpu_us_per_request / pair["off"].cpu_us_per_request
        rps_ratios.append(rps)
        cpu_ratios.append(cpu)
        print(f"| {number} | {rps:.3f} | {cpu:.3f} |")
    rps_median, cpu_median = statistics.median(rps_ratios), statistics.median(cpu_ratios)
    print()
    print("| median over rounds | on/off req/s (min-max) | on/off CPU us/req (min-max) | floor | verdict |")
    print("|---|---|---|---|---|")
    print(
        f"| {args.rounds} rounds | {rps_median:.3f} ({min(rps_ratios):.3f}-{max(rps_ratios):.3f}) "
        f"| {cpu_median:.3f} ({min(cpu_ratios):.3f}-{max(cpu_ratios):.3f}) | >= {FLOOR:.2f} "
        f"| {'PASS' if rps_median >= FLOOR else 'MISS'} |"
    )
    for name in ("off", "on"):
        runs = [b.run for b in bursts if b.variant == name]
        print(
            f"cache {name}: median {statistics.median(r.throughput for r in runs):.0f} req/s, "
            f"{statistics.median(r.cpu_us_per_request for r in runs):.0f} us CPU/req"
        )


if __name__ == "__main__":
    main()
