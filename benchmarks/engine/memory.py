"""Peak RSS of the embedded engine with its default KV budget full: 16 concurrent 4k-token sequences.

Runs in its own process (the benchmark starts it) so `transformers` does not count against us.
Prints one JSON object: peak RSS, weight bytes, KV pool bytes and the workload.

    .venv/bin/python -m benchmarks.engine.memory --threads 2
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from adapters.local import LocalEngine, LocalEngineConfig
from benchmarks.engine.workloads import ours, token_ids

SEQUENCES = 16
SEQUENCE_TOKENS = 4096
NEW_TOKENS = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sequence-tokens", type=int, default=SEQUENCE_TOKENS)
    parser.add_argument("--no-c-kernels", action="store_true", help="c_kernels = false")
    parser.add_argument("--prefill-activations", choices=("auto", "int8", "fp32"), default="auto")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = LocalEngineConfig(
        threads=args.threads, c_kernels=not args.no_c_kernels, prefill_activations=args.prefill_activations
    )
    engine = LocalEngine(config)
    engine.start_sync()
    ours(engine, [token_ids(16, seed=1)], 2)  # touches every weight page once
    idle = _rss_bytes()
    prompts = [token_ids(args.sequence_tokens - NEW_TOKENS, seed=7000 + i) for i in range(SEQUENCES)]
    start = time.perf_counter()
    wall, _ = ours(engine, prompts, NEW_TOKENS)
    stats = engine.stats()
    assert stats is not None
    weights, pool_bytes = stats.weight_bytes, stats.kv_pool_bytes
    engine.close_sync()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        json.dumps(
            {
                "sequences": SEQUENCES,
                "tokens_per_sequence": args.sequence_tokens,
                "kv_budget_tokens": config.kv_budget_tokens,
                "weights_bytes": weights,
                "kv_pool_bytes": pool_bytes,
                "peak_rss_bytes": peak,
                "idle_rss_bytes": idle,
                "runtime_bytes": idle - weights,
                "headroom_bytes": weights + pool_bytes + 300 * 2**20 - peak,
                "preemptions": stats.preemptions,
                "wall_s": round(wall, 1),
                "elapsed_s": round(time.perf_counter() - start, 1),
            }
        )
    )


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


if __name__ == "__main__":
    main()
