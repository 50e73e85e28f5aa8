"""The embedded engine against `transformers` and llama.cpp (where `llama-cpp-python`, the optional
`bench` extra, is installed), side by side (each baseline in a process of its own: see
`reference_process`): same model (the GGUF), same prompts, same thread count. Prints a markdown
table and writes JSON to benchmarks/engine/out/.

    .venv/bin/python -m benchmarks.engine.run --threads 2
    .venv/bin/python -m benchmarks.engine.run --threads 2 --only prefill decode   # a subset
    .venv/bin/python -m benchmarks.engine.run --no-c-kernels   # torch's kernels, as a host without AVX-512

Sections (the issue's floors in brackets):
- cold prefill of 2,176 tokens: time to first token, prefill tokens/s          [>= 1.2x transformers]
- 2,048 cached prefix + 128-token question: time to first token                [<= 1/10 of cold]
- single-stream greedy decode at 2.2k context, ms/token                          [<= 0.5x transformers]
- 16 concurrent streams (128-token prompts, 128 tokens each): aggregate tok/s   [>= 4x one stream]
- few-shot: 8 groups x 8 prompts, 1,024-token shared prefix, 64-token answers   [radix >= 3x no radix]
- peak RSS with the default KV budget full (16 x 4,096 tokens), own process      [<= weights + KV + 300 MB]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from adapters.local import LocalEngine, LocalEngineConfig
from adapters.local.kv_pool import dtype_name, kv_dtype
from adapters.local.loader import LoadedModel, load_model
from benchmarks.engine.reference_process import LlamaProcess, ReferenceProcess
from benchmarks.engine.run_table import table
from benchmarks.engine.workloads import (
    decode_phase_tok_s,
    ours,
    per_token_ms,
    token_ids,
)

OUT_DIR = Path(__file__).parent / "out"
COLD_TOKENS, PREFIX_TOKENS, QUESTION_TOKENS = 2176, 2048, 128
DECODE_TOKENS = 65
STREAMS, STREAM_PROMPT, STREAM_TOKENS = 16, 128, 128
GROUPS, PER_GROUP, SHARED, OWN, ANSWER = 8, 8, 1024, 32, 64
SECTIONS = ("prefill", "decode", "concurrency", "few_shot", "memory")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--reps", type=int, default=3, help="repetitions of the latency measurements (median)"
    )
    parser.add_argument("--skip-memory", action="store_true", help="skip the 16 x 4k-token RSS run")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="run only these sections (each reported with its own baseline, as in a full run)",
    )
    parser.add_argument(
        "--no-c-kernels", action="store_true", help="c_kernels = false: torch's kernels on any host"
    )
    parser.add_argument("--decode-weights", choices=("packed", "fp32"), default="packed")
    parser.add_argument("--no-speculation", action="store_true", help="speculative = false (batching alone)")
    parser.add_argument("--kv-dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    parser.add_argument(
        "--prefill-activations",
        choices=("auto", "int8", "fp32"),
        default="auto",
        help="prompt rows' products; fp32 on torch's path: the exact copy, shipped before the half ones",
    )
    args = parser.parse_args()
    only = set(args.only) - ({"memory"} if args.skip_memory else set())
    torch.set_num_threads(args.threads)
    started = time.time()
    load_before = os.getloadavg()
    config = LocalEngineConfig(
        threads=args.threads,
        c_kernels=not args.no_c_kernels,
        decode_weights=args.decode_weights,
        kv_dtype=args.kv_dtype,
        speculative=not args.no_speculation,
        prefill_activations=args.prefill_activations,
    )
    loaded = _load_off_main(config)
    reference_model = ReferenceProcess(args.threads) if only & {"prefill", "decode"} else None
    llama = None
    if only & {"prefill", "decode"}:
        if LlamaProcess.installed():
            llama = LlamaProcess(args.threads, COLD_TOKENS + DECODE_TOKENS + 64)
        else:
            print("llama-cpp-python is not installed (pip install -e '.[bench]'): no llama.cpp column")
    results: dict[str, Any] = {
        "machine": _machine(args.threads),
        "command": "python -m benchmarks.engine.run " + " ".join(sys.argv[1:]),
        "config": {
            "page_size": config.page_size,
            "max_prefill_tokens": config.max_prefill_tokens,
            "max_idle_prefill_tokens": config.max_idle_prefill_tokens,
            "dtype": config.dtype,
            "c_kernels": loaded.model.attends_in_kernel,
            "decode_weights": config.decode_weights,
            "prefill_activations": config.prefill_activations,
            "kv_dtype": dtype_name(kv_dtype(config.kv_dtype, loaded.model.dtype, loaded.model.serves_packed)),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "llama_cpp_cpu": llama.cpu if llama is not None else None,
        },
    }
    if "prefill" in only:
        _progress("prefill")
        assert reference_model is not None  # loaded for this section
        results["prefill"] = _prefill(loaded, config, reference_model, llama, args.reps)
    if "decode" in only:
        _progress("decode")
        assert reference_model is not None
        results["decode"] = _decode(loaded, config, reference_model, llama, args.reps)
    if "concurrency" in only:
        _progress("concurrency")
        results["concurrency"] = _concurrency(loaded, config, args.reps)
    if "few_shot" in only:
        _progress("few-shot")
        results["few_shot"] = _few_shot(loaded, config)
    if "memory" in only:
        _progress("memory")
        results["memory"] = _memory(args.threads, args.no_c_kernels, config.prefill_activations)
    for baseline in (reference_model, llama):
        if baseline is not None:
            baseline.close()
    results["load_average"] = {"start": load_before, "end": os.getloadavg()}
    results["elapsed_s"] = round(time.time() - started, 1)
    OUT_DIR.mkdir(exist_ok=True)
    out = OUT_DIR / time.strftime("engine-%Y%m%d-%H%M%S.json")
    out.write_text(json.dumps(results, indent=2))
    used = results["config"]
    print(f"torch {used['cpu_capability']} code, KV {used['kv_dtype']}; llama.cpp: {used['llama_cpp_cpu']}")
    print(table(results))
    print(f"\nraw results: {out}")


def _progress(section: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {section} (load average {os.getloadavg()[0]:.1f})", file=sys.stderr)


def _load_off_main(config: LocalEngineConfig) -> LoadedModel:
    """`load_model` on a thread that then ends, as `LocalEngine.start` loads: torch's OpenMP
    (libgomp) keeps a thread team per thread that ran parallel work, and while two teams hold more
    threads than the host has cores its threads stop spinning between regions, which slowed the
    engine thread's steps 1.4-1.7x (2 cores; a team dies with its thread). So the baselines run in
    processes of their own (`reference_process`) and a timed section keeps one engine at a time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(load_model, config).result()


def _engine(loaded: LoadedModel, config: LocalEngineConfig, **overrides: Any) -> LocalEngine:
    engine = LocalEngine(replace(config, **overrides), model=loaded)
    engine.start_sync()
    return engine


def _prefill(
    loaded: LoadedModel,
    config: LocalEngineConfig,
    model: ReferenceProcess,
    llama: LlamaProcess | None,
    reps: int,
) -> dict[str, Any]:
    # One engine (a second engine thread's OpenMP team would throttle both, see `_load_off_main`);
    # the cold prompts are fresh random ids, so its radix cache misses them whole.
    engine = _engine(loaded, config)
    ours_cold, theirs_cold, theirs_forward, ours_cached, theirs_cached = [], [], [], [], []
    llama_cold: list[float] = []
    prefix = token_ids(PREFIX_TOKENS, seed=100)
    ours(engine, [prefix + token_ids(QUESTION_TOKENS, seed=200)], 1)  # caches the prefix
    for rep in range(reps):
        prompt = token_ids(COLD_TOKENS, seed=rep)
        ours_cold.append(ours(engine, [prompt], 1)[1][0].first_token_s)
        theirs_cold.append(model.generate(prompt, 1).first_token_s)
        theirs_forward.append(model.forward_s(prompt))
        if llama is not None:
            llama_cold.append(llama.generate(prompt, 1).first_token_s)
        question = token_ids(QUESTION_TOKENS, seed=300 + rep)
        timed = ours(engine, [prefix + question], 1)[1][0]
        ours_cached.append(timed.first_token_s)
        theirs_cached.append(model.suffix_ttft(prefix, question))
    engine.close_sync()
    ours_s, theirs_s, forward_s, cached_s = (
        statistics.median(v) for v in (ours_cold, theirs_cold, theirs_forward, ours_cached)
    )
    out: dict[str, Any] = {
        "cold_ttft_s": {
            "ours": ours_s,
            "transformers_generate": theirs_s,
            "transformers_forward": forward_s,
            "samples": {"ours": ours_cold, "generate": theirs_cold, "forward": theirs_forward},
        },
        "prefill_tok_s": {
            "ours": COLD_TOKENS / ours_s,
            "transformers_generate": COLD_TOKENS / theirs_s,
            "transformers_forward": COLD_TOKENS / forward_s,
        },
        "prefill_speedup_vs_generate": theirs_s / ours_s,
        "prefill_speedup_vs_forward": forward_s / ours_s,
        "cached_ttft_s": {"ours": cached_s, "transformers_reused_kv": statistics.median(theirs_cached)},
        "cached_over_cold": cached_s / ours_s,
    }
    if llama_cold:
        llama_s = statistics.median(llama_cold)
        out["llama_cpp"] = {
            "cold_ttft_s": llama_s,
            "samples": llama_cold,
            "prefill_speedup": llama_s / ours_s,
        }
    return out


def _decode(
    loaded: LoadedModel,
    config: LocalEngineConfig,
    model: ReferenceProcess,
    llama: LlamaProcess | None,
    reps: int,
) -> dict[str, Any]:
    # Alternating repetitions, median of each: on a shared machine load comes and goes, and
    # measuring one engine right after the other would give the difference to whichever ran quieter.
    engine = _engine(loaded, config, radix_cache=False)
    ours_samples, theirs_samples, llama_samples = [], [], []
    for rep in range(reps):
        prompt = token_ids(COLD_TOKENS, seed=400 + rep)
        ours_samples.append(per_token_ms(ours(engine, [prompt], DECODE_TOKENS)[1][0]))
        theirs_samples.append(per_token_ms(model.generate(prompt, DECODE_TOKENS)))
        if llama is not None:
            llama_samples.append(per_token_ms(llama.generate(prompt, DECODE_TOKENS)))
    engine.close_sync()
    ours_ms, theirs_ms = statistics.median(ours_samples), statistics.median(theirs_samples)
    out: dict[str, Any] = {
        "context": COLD_TOKENS,
        "ms_per_token": {"ours": ours_ms, "transformers": theirs_ms},
        "samples": {"ours": ours_samples, "transformers": theirs_samples},
        "ratio": ours_ms / theirs_ms,
    }
    if llama_samples:
        llama_ms = statistics.median(llama_samples)
        out["llama_cpp"] = {"ms_per_token": llama_ms, "samples": llama_samples, "ratio": ours_ms / llama_ms}
    return out


def _concurrency(loaded: LoadedModel, config: LocalEngineConfig, reps: int) -> dict[str, Any]:
    """One stream, then 16 at once, `reps` times alternating; medians of each (a single 128-token
    stream lasts ~4 s, so one sample of it moved the ratio by 10-20 % on this shared machine).
    Beside the floor's end-to-end figure (prefills included), the decode phase alone: tokens per
    second from the last stream's first token to the end, against one stream's after its first."""
    engine = _engine(loaded, config, radix_cache=False)
    prompts = [token_ids(STREAM_PROMPT, seed=500 + i) for i in range(STREAMS)]
    singles, manys, single_decodes, many_decodes, last_firsts = [], [], [], [], []
    for _ in range(reps):
        seconds, timed = ours(engine, prompts[:1], STREAM_TOKENS)
        singles.append(STREAM_TOKENS / seconds)
        single_decodes.append(decode_phase_tok_s(timed))
        seconds, timed = ours(engine, prompts, STREAM_TOKENS)
        manys.append(STREAMS * STREAM_TOKENS / seconds)
        many_decodes.append(decode_phase_tok_s(timed))
        last_firsts.append(max(t.first_token_s for t in timed))
    engine.close_sync()
    single, many = statistics.median(singles), statistics.median(manys)
    single_decode, many_decode = statistics.median(single_decodes), statistics.median(many_decodes)
    return {
        "single_tok_s": single,
        "aggregate_tok_s": many,
        "ratio": many / single,
        "single_samples": singles,
        "aggregate_samples": manys,
        "decode_phase": {
            "single_tok_s": single_decode,
            "aggregate_tok_s": many_decode,
            "ratio": many_decode / single_decode,
            "last_first_token_s": statistics.median(last_firsts),
            "single_samples": single_decodes,
            "aggregate_samples": many_decodes,
        },
    }


def _few_shot(loaded: LoadedModel, config: LocalEngineConfig) -> dict[str, Any]:
    prompts = [
        token_ids(SHARED, seed=1000 + g) + token_ids(OWN, seed=2000 + g * PER_GROUP + i)
        for g in range(GROUPS)
        for i in range(PER_GROUP)
    ]
    out: dict[str, Any] = {}
    for name, radix in (("radix", True), ("no_radix", False)):
        engine = _engine(loaded, config, radix_cache=radix)
        wall, _ = ours(engine, prompts, ANSWER)
        stats = engine.stats()
        engine.close_sync()
        out[name] = {
            "wall_s": wall,
            "tok_s": len(prompts) * ANSWER / wall,
            "cache_hit_tokens": stats.cache_hit_tokens if stats else 0,
        }
    out["ratio"] = out["radix"]["tok_s"] / out["no_radix"]["tok_s"]
    return out


def _memory(threads: int, no_c_kernels: bool, prefill_activations: str) -> dict[str, Any]:
    """`benchmarks.engine.memory` in a process of its own, in this run's kernels and prompt mode."""
    command = [sys.executable, "-m", "benchmarks.engine.memory", "--threads", str(threads)]
    command += ["--no-c-kernels"] if no_c_kernels else []
    command += ["--prefill-activations", prefill_activations]
    done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=Path(__file__).parents[2])
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _machine(threads: int) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    main()
