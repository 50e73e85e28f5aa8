"""Speculative decoding in the embedded engine: greedy decode tokens/s with and without it, side by
side in one process (each prompt run both ways in turn, the order alternating by round).

    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.speculative
    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.speculative --no-c-kernels

Prompt sets (chat-templated for SmolLM2-135M-Instruct, 96 new tokens each, greedy):
- `copy`: answers that copy their input: code edits, extraction, quoting, reformatting
  (`benchmarks.engine.speculative_prompts`);                                     [spec >= 2.0x]
- `fresh`: answers with nothing to copy (stories, explanations);                [spec >= 0.95x]
- `repeat`: the `fresh` prompts asked again by another request (the radix tree holds the first
  answer; the response cache is the gateway's and is not in this engine).
Before each `copy` and `fresh` run the prefix cache is flushed, so the only drafts are the request's
own (prompt lookup). Decode tokens/s is (tokens - 1) / (time of the last token - time of the
first), summed over a set's prompts; the acceptance per source comes from the engine's counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from adapters.local import LocalEngine, LocalEngineConfig
from adapters.local.config import DEFAULT_MAX_DRAFT_TOKENS
from adapters.local.drafts import SourceFigures, SpeculationFigures
from adapters.local.loader import load_model
from adapters.local.sampling import SamplingParams
from adapters.schema import ChatMessage
from benchmarks.engine.speculative_prompts import COPY_PROMPTS, FRESH_PROMPTS

OUT_DIR = Path(__file__).parent / "out"
NEW_TOKENS = 96


@dataclass(slots=True)
class Tally:
    """Decode tokens and seconds of one set, one way."""

    tokens: int = 0
    seconds: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


async def _decode(engine: LocalEngine, prompt: list[int], speculate: bool) -> tuple[int, float, list[int]]:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
    tokens: list[int] = []
    first = last = 0.0
    async for deltas in engine.generate_stream(prompt, params, speculate=speculate):
        now = time.perf_counter()
        first = first or now
        last = now
        tokens.extend(d.token_id for d in deltas)
    # The first step's tokens arrive at `first`; every later token is decode work.
    return len(tokens) - 1, last - first, tokens


def _figures(engine: LocalEngine) -> SpeculationFigures:
    stats = engine.stats()
    assert stats is not None and stats.speculation is not None
    return stats.speculation


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-c-kernels", action="store_true", help="c_kernels = false")
    parser.add_argument("--max-draft-tokens", type=int, default=DEFAULT_MAX_DRAFT_TOKENS)
    parser.add_argument("--only", nargs="+", choices=("copy", "fresh"), default=("copy", "fresh"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = LocalEngineConfig(
        threads=args.threads, c_kernels=not args.no_c_kernels, max_draft_tokens=args.max_draft_tokens
    )
    loaded = load_model(config)
    engine = LocalEngine(config, model=loaded)
    engine.start_sync()

    def ids(text: str) -> list[int]:
        return loaded.tokenizer.encode(loaded.template.render([ChatMessage(role="user", content=text)]))

    prompts = {"copy": COPY_PROMPTS, "fresh": FRESH_PROMPTS}
    sets = {name: [ids(p) for p in prompts[name]] for name in args.only}
    tallies = {(name, way): Tally() for name in (*sets, "repeat") for way in ("off", "on")}
    sources: dict[str, SpeculationFigures] = {}
    for rnd in range(args.rounds):
        for name, prompts in sets.items():
            before = _figures(engine)
            for prompt in prompts:
                ways = ("off", "on") if rnd % 2 == 0 else ("on", "off")
                for way in ways:
                    asyncio.run(engine.flush_cache())
                    n, s, out = asyncio.run(_decode(engine, prompt, way == "on"))
                    tally = tallies[(name, way)]
                    tally.tokens, tally.seconds = tally.tokens + n, tally.seconds + s
                    tally.outputs.append(out)
            sources[name] = _delta(before, _figures(engine))
        before = _figures(engine)
        for prompt in sets.get("fresh", []):  # asked again: the previous run's answer is in the tree
            for way in ("off", "on") if rnd % 2 == 0 else ("on", "off"):
                n, s, out = asyncio.run(_decode(engine, prompt, way == "on"))
                tally = tallies[("repeat", way)]
                tally.tokens, tally.seconds = tally.tokens + n, tally.seconds + s
                tally.outputs.append(out)
        sources["repeat"] = _delta(before, _figures(engine))
    engine.close_sync()
    report = {
        "host": platform.processor() or platform.machine(),
        "threads": args.threads,
        "c_kernels": not args.no_c_kernels,
        "max_draft_tokens": args.max_draft_tokens,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "sets": {},
    }
    print("| set | off tok/s | on tok/s | on/off | identical | accepted/drafted by source |")
    print("|---|---|---|---|---|---|")
    for name in (*sets, "repeat") if "fresh" in sets else sets:
        off, on = tallies[(name, "off")], tallies[(name, "on")]
        same = off.outputs == on.outputs
        figures = sources[name]
        by_source = ", ".join(
            f"{src} {f.accepted_tokens}/{f.drafted_tokens}" for src, f in figures.sources if f.drafted_tokens
        )
        ratio = on.rate / off.rate if off.rate else 0.0
        print(f"| {name} | {off.rate:.1f} | {on.rate:.1f} | {ratio:.2f}x | {same} | {by_source or '-'} |")
        report["sets"][name] = {  # type: ignore[index]
            "off_tok_s": off.rate,
            "on_tok_s": on.rate,
            "ratio": ratio,
            "identical": same,
            "sources": {src: [f.accepted_tokens, f.drafted_tokens, f.drafts] for src, f in figures.sources},
        }
    OUT_DIR.mkdir(exist_ok=True)
    suffix = "torch" if args.no_c_kernels else "c"
    (OUT_DIR / f"speculative_{suffix}.json").write_text(json.dumps(report, indent=2))


def _delta(before: SpeculationFigures, after: SpeculationFigures) -> SpeculationFigures:
    """The counters' growth between two snapshots."""
    earlier = dict(before.sources)
    return SpeculationFigures(
        verify_steps=after.verify_steps - before.verify_steps,
        drafted_tokens=after.drafted_tokens - before.drafted_tokens,
        accepted_tokens=after.accepted_tokens - before.accepted_tokens,
        tokens_generated=after.tokens_generated - before.tokens_generated,
        early_stops=after.early_stops - before.early_stops,
        sources=tuple(
            (
                name,
                SourceFigures(
                    f.drafts - earlier[name].drafts,
                    f.drafted_tokens - earlier[name].drafted_tokens,
                    f.accepted_tokens - earlier[name].accepted_tokens,
                ),
            )
            for name, f in after.sources
        ),
    )


if __name__ == "__main__":
    main()
