"""What a speculative draft's verification rows cost: one decode step of one sequence with 1 + k
rows (its next token plus k draft tokens), by k, straight on the model runner.

    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.verify_rows
    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.verify_rows --no-c-kernels
"""

from __future__ import annotations

import argparse
import time

import torch

from adapters.local import LocalEngineConfig
from adapters.local.kv_pool import KVPool
from adapters.local.loader import load_model
from adapters.local.runner import ModelRunner
from adapters.local.sampling import SamplingParams
from adapters.local.scheduler import ScheduledStep
from adapters.local.sequence import GenerationJob, Sequence

DRAFTS = (0, 1, 2, 3, 4, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-c-kernels", action="store_true", help="c_kernels = false")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(LocalEngineConfig(c_kernels=not args.no_c_kernels, threads=args.threads)).model
    page_size = 16
    pool = KVPool(model.spec, 256, page_size, model.dtype)
    runner = ModelRunner(model, pool)
    job = GenerationJob(
        job_id=1, groups=[], params=SamplingParams(max_tokens=1), salt="", sink=lambda e: None
    )
    seq = Sequence(job, [100 + i % 1000 for i in range(args.context)], 0, None, None)  # type: ignore[arg-type]
    seq.pages = pool.alloc(-(-(args.context + max(DRAFTS) + 1) // page_size)) or []
    seq.num_computed = args.context - 1
    best = {k: float("inf") for k in DRAFTS}
    for _ in range(args.rounds):
        for k in DRAFTS:
            seq.draft = [5] * k
            step = ScheduledStep(decodes=[seq])
            started = time.perf_counter()
            for _ in range(3):
                runner.run(step)
                seq.num_computed -= 1  # the same step again
            best[k] = min(best[k], (time.perf_counter() - started) / 3 * 1e3)
    path = "torch kernels" if args.no_c_kernels else "C kernels"
    print(
        f"| rows ({path}, {args.context} context, {args.threads} thread) | "
        + " | ".join(str(1 + k) for k in DRAFTS)
        + " |"
    )
    print("|---|" + "---|" * len(DRAFTS))
    print("| ms per step (min) | " + " | ".join(f"{best[k]:.1f}" for k in DRAFTS) + " |")


if __name__ == "__main__":
    main()
