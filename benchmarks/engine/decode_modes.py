"""Single-stream decode ms/token at 2.2k context, with speculative decoding on (the default) and off,
beside llama.cpp (no speculation), on random token ids and on natural text.

`benchmarks.engine.run`'s decode section measures the default engine, whose n-gram drafts accept
unusually well on its random-id prompts (greedy decoding after random ids falls into loops). This
one separates the engine's step from speculation's gain, and gives the gain on prose too, so the
llama.cpp comparison can be read like for like.

    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.decode_modes [--no-c-kernels]

Each engine runs alone and is closed before the next starts (two engine threads in one process
would throttle each other's OpenMP teams; see `reference_process`); llama.cpp runs in its own process.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from adapters.local import LocalEngineConfig
from benchmarks.engine.reference_process import LlamaProcess
from benchmarks.engine.run import COLD_TOKENS, DECODE_TOKENS, _engine, _load_off_main
from benchmarks.engine.workloads import ours, per_token_ms, token_ids

TEXT_FILES = ("docs/architecture.md", "docs/routing.md", "README.md")
"""The prose prompts: this repository's own docs, cut into overlapping 2,176-token spans."""
PROMPTS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-c-kernels", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = LocalEngineConfig(threads=args.threads, c_kernels=not args.no_c_kernels)
    loaded = _load_off_main(config)
    text = loaded.tokenizer.encode("".join(Path(f).read_text() for f in TEXT_FILES))
    prompts = {
        "random ids": [token_ids(COLD_TOKENS, seed=400 + r) for r in range(PROMPTS)],
        "text": [text[r * 300 : r * 300 + COLD_TOKENS] for r in range(PROMPTS)],
    }
    llama = LlamaProcess(args.threads, COLD_TOKENS + DECODE_TOKENS + 64) if LlamaProcess.installed() else None
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, C kernels {not args.no_c_kernels}")
    if llama is not None:
        print(f"llama.cpp {llama.cpu}")
    modes = {"speculation on (default)": config, "speculation off": replace(config, speculative=False)}
    print("| prompts | " + " | ".join(modes) + " | llama.cpp | off / llama.cpp | on / llama.cpp |")
    print("|---|" + "---|" * (len(modes) + 3))
    for kind, batch in prompts.items():
        ms: dict[str, float] = {}
        for name, mode in modes.items():
            engine = _engine(loaded, mode, radix_cache=False)
            ms[name] = statistics.median(per_token_ms(ours(engine, [p], DECODE_TOKENS)[1][0]) for p in batch)
            engine.close_sync()
        on, off = ms["speculation on (default)"], ms["speculation off"]
        if llama is None:
            print(f"| {kind} | {on:.1f} | {off:.1f} | - | - | - |")
            continue
        theirs = statistics.median(per_token_ms(llama.generate(p, DECODE_TOKENS)) for p in batch)
        print(f"| {kind} | {on:.1f} | {off:.1f} | {theirs:.1f} | {off / theirs:.2f}x | {on / theirs:.2f}x |")
    if llama is not None:
        llama.close()


if __name__ == "__main__":
    main()
