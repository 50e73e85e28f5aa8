"""Beam search's cost in the embedded engine: width 4 against greedy decoding for the same number of
new tokens, side by side in one process (alternating, medians over rounds).

    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.beam_search
    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.beam_search --no-c-kernels

Each prompt runs to `max_tokens` (prompts that run long; a run that stops early is left out of the
ratio and said so). The floor: width 4 at most 2.5x the time of greedy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time

import torch

from adapters.base import EngineRequest
from adapters.local import LocalEngine, LocalEngineConfig
from adapters.schema import ChatCompletionRequest, ChatMessage
from benchmarks.engine.speculative import OUT_DIR
from benchmarks.engine.speculative_prompts import FRESH_PROMPTS

NEW_TOKENS = 48


def request(content: str, **fields: object) -> EngineRequest:
    params = ChatCompletionRequest(
        model="m", messages=[ChatMessage(role="user", content=content)], max_tokens=NEW_TOKENS, **fields
    )
    return EngineRequest(
        operation="chat", params=params, raw_body=b"", request_id="b", tenant_id="t", cache_salt=""
    )


async def timed(engine: LocalEngine, content: str, **fields: object) -> tuple[float, list[str]]:
    started = time.perf_counter()
    completion = await engine.complete(request(content, **fields))
    reasons = [c["finish_reason"] for c in json.loads(completion.body)["choices"]]
    return time.perf_counter() - started, reasons


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--no-c-kernels", action="store_true", help="c_kernels = false")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = LocalEngineConfig(
        threads=args.threads, c_kernels=not args.no_c_kernels, radix_cache=False, speculative=False
    )
    engine = LocalEngine(config)
    engine.start_sync()
    ratios: list[float] = []
    left_out = 0
    for rnd in range(args.rounds):
        for prompt in FRESH_PROMPTS[:4]:
            ways = ("greedy", "beam") if rnd % 2 == 0 else ("beam", "greedy")
            seconds: dict[str, float] = {}
            full = True
            for way in ways:
                fields: dict[str, object] = (
                    {"temperature": 0} if way == "greedy" else {"n": args.width, "use_beam_search": True}
                )
                seconds[way], reasons = asyncio.run(timed(engine, prompt, **fields))
                full = full and all(r == "length" for r in reasons)
            if full:
                ratios.append(seconds["beam"] / seconds["greedy"])
            else:
                left_out += 1
    engine.close_sync()
    median = statistics.median(ratios) if ratios else float("nan")
    print(
        f"| width {args.width} / greedy time, {NEW_TOKENS} tokens | median {median:.2f}x "
        f"(min {min(ratios, default=0):.2f}, max {max(ratios, default=0):.2f}; {len(ratios)} runs, "
        f"{left_out} left out: ended before max_tokens) |"
    )
    OUT_DIR.mkdir(exist_ok=True)
    suffix = "torch" if args.no_c_kernels else "c"
    report = {
        "host": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "width": args.width,
        "ratios": ratios,
        "median": median,
        "left_out": left_out,
    }
    (OUT_DIR / f"beam_search_{suffix}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
