"""One decode step of the embedded engine, timed (and profiled) alone: `rows` sequences at `context`
tokens each, their KV pages filled with random values (the step's cost does not depend on them),
so no prefill is needed and a variant of the step can be measured in seconds.

    .venv/bin/python -m benchmarks.engine.decode_step --no-c-kernels --rows 1 16 --context 2176 128
    .venv/bin/python -m benchmarks.engine.decode_step --no-c-kernels --rows 1 --profile   # torch.profiler
    .venv/bin/python -m benchmarks.engine.decode_step --portable-c-kernels   # the tests' SIMDe build

The steps of every (rows, context) take turns round by round (load on a shared box comes and goes);
medians are printed in ms per step.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from adapters.local import LocalEngineConfig
from adapters.local.kernels import load_kernel
from adapters.local.kv_pool import KV_DTYPES, KVPool, dtype_name, kv_dtype
from adapters.local.loader import LoadedModel, load_model
from adapters.local.runner import ModelRunner
from adapters.local.sampling import SamplerState, SamplingParams
from adapters.local.scheduler import ScheduledStep
from adapters.local.sequence import GenerationJob, Sequence
from adapters.local.text_stream import TextStream


def decoding(
    loaded: LoadedModel, rows: int, context: int, kv_dtype: torch.dtype, page_size: int = 16
) -> tuple[ModelRunner, ScheduledStep]:
    """A runner over a pool holding `rows` sequences of `context` computed tokens (consecutive pages
    each, as a fresh engine lays them out), and the step that decodes all of them once."""
    model = loaded.model
    per_seq = -(-(context + 2) // page_size)
    pool = KVPool(model.spec, rows * per_seq, page_size, kv_dtype)
    generator = torch.Generator().manual_seed(0)
    pool.k.copy_(torch.randn(pool.k.shape, generator=generator))
    pool.v.copy_(torch.randn(pool.v.shape, generator=generator))
    params = SamplingParams(max_tokens=1, temperature=0.0)
    job = GenerationJob(job_id=0, groups=[], params=params, salt="", sink=lambda events: None)
    seqs = []
    for row in range(rows):
        ids = [(row * 7919 + i * 104729) % model.spec.vocab_size for i in range(context + 1)]
        sampler = SamplerState(params, model.spec.vocab_size, ids, 0)
        seq = Sequence(job, ids, 0, sampler, TextStream(loaded.tokenizer, ()))
        seq.pages = list(range(row * per_seq, (row + 1) * per_seq))
        seq.num_computed = context
        seqs.append(seq)
    return ModelRunner(model, pool), ScheduledStep(decodes=seqs)


def step_ms(runner: ModelRunner, step: ScheduledStep) -> float:
    """One decode step, ms; the sequences stay at their context (the step rewrites the same slot)."""
    start = time.perf_counter()
    runner.run(step)
    elapsed = (time.perf_counter() - start) * 1000
    for seq in step.decodes:
        seq.num_computed -= 1
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--context", type=int, nargs="+", default=[2176, 128])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-c-kernels", action="store_true")
    parser.add_argument(
        "--portable-c-kernels", action="store_true", help="the C kernels' SIMDe build (never served)"
    )
    parser.add_argument("--decode-weights", choices=("packed", "fp32"), default="packed")
    parser.add_argument("--kv-dtypes", nargs="+", choices=["auto", *sorted(KV_DTYPES)], default=["auto"])
    parser.add_argument("--profile", action="store_true", help="torch.profiler table of the first case")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = LocalEngineConfig(
        threads=args.threads, c_kernels=not args.no_c_kernels, decode_weights=args.decode_weights
    )
    loaded = load_model(config, kernels=functools.partial(load_kernel, portable=args.portable_c_kernels))
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"CPU capability {capability}, C kernels {loaded.model.attends_in_kernel}")
    model = loaded.model
    kv_dtypes = {
        dtype_name(dtype): dtype
        for dtype in (kv_dtype(choice, model.dtype, model.serves_packed) for choice in args.kv_dtypes)
    }
    cases = {
        (r, c, name): decoding(loaded, r, c, dtype)
        for name, dtype in kv_dtypes.items()
        for r in args.rows
        for c in args.context
    }
    for runner, step in cases.values():  # warm-up
        for _ in range(3):
            step_ms(runner, step)
    samples: dict[tuple[int, int, str], list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case, (runner, step) in cases.items():
            samples[case].append(step_ms(runner, step))
    print("| rows | context | KV | ms/step (median) | tok/s |\n|---|---|---|---|---|")
    for (rows, context, name), values in samples.items():
        ms = statistics.median(values)
        print(f"| {rows} | {context} | {name} | {ms:.2f} | {rows * 1000 / ms:.1f} |")
    if args.profile:
        runner, step = next(iter(cases.values()))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                step_ms(runner, step)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
