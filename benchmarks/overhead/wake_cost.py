"""CPU cost of waking from idle: the same Python work timed back to back and after each sleep.

At a steady low request rate every request wakes the gateway's loop from idle; on a virtual machine
whose idle vCPU halts, the work right after a wake runs with cold caches and TLBs. This measures that
penalty alone, without sockets: `time.thread_time()` around the work only, so the sleep itself is
not counted.

    taskset -c 0 python -m benchmarks.overhead.wake_cost
"""

from __future__ import annotations

import argparse
import json
import time


def work(size: int) -> None:
    """Allocation-heavy Python work, about what a request's handlers do: dicts, lists, JSON."""
    data: dict[str, object] = {}
    for i in range(size):
        data[str(i)] = [i, i * 2, {"a": i}]
    json.loads(json.dumps(data))


def cpu_per_run(size: int, sleep_s: float, runs: int) -> float:
    """Mean thread CPU seconds of one `work(size)`, with `sleep_s` of idle before each run."""
    total = 0.0
    for _ in range(runs):
        if sleep_s:
            time.sleep(sleep_s)
        started = time.thread_time()
        work(size)
        total += time.thread_time() - started
    return total / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 100])
    parser.add_argument("--sleep-ms", type=float, default=3.0, help="idle before each run (300 req/s: 3.3)")
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    for _ in range(200):
        work(max(args.sizes))
    for size in args.sizes:
        warm = cpu_per_run(size, 0.0, args.runs)
        woken = cpu_per_run(size, args.sleep_ms / 1000, args.runs)
        print(
            f"work size {size:4d}: back to back {warm * 1e6:7.1f} µs, after {args.sleep_ms:g} ms idle "
            f"{woken * 1e6:7.1f} µs (+{(woken - warm) * 1e6:.1f} µs per wake)"
        )


if __name__ == "__main__":
    main()
