"""What constrained decoding costs per token on the embedded engine, measured side by side.

Two measurements, in one process, reps alternated:

- `mask`: `grammar.mask_rows` alone on the real vocabulary (49,152 tokens), for 1, 4 and 16
  constrained rows of a JSON-schema grammar advanced along a document, against the same call
  with no constrained row (what every free step pays): microseconds per row per step.
- `mask_ways`: the same rows masked each way side by side, reps alternated: `mask_rows`
  (llguidance's byte-per-token mask, filled by numpy), llguidance's own bitmask helpers
  (`llguidance.numpy` and `llguidance.torch` `fill_next_token_bitmask` +
  `apply_token_bitmask_inplace`; the torch one is `torch.compile`d, warmed first), and the bitmask
  unpacked by numpy then filled by torch (what `mask_rows` did before).
- `engine`: chat requests through `LocalEngine.complete`, greedy, 64 generated tokens each (free rows
  ban EOS, constrained rows follow a schema whose array cannot close within 64 tokens), at 1 and 8
  concurrent streams, all free, all constrained, and half and half (free and constrained rows in the
  same steps): wall milliseconds per generated token.

    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.structured_outputs --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import llguidance
import llguidance.numpy
import llguidance.torch
import numpy as np
import torch

from adapters.base import EngineRequest
from adapters.local import LocalEngine, LocalEngineConfig
from adapters.local.grammar import GrammarCompiler, GrammarState, mask_rows
from adapters.local.loader import LoadedModel, load_model
from adapters.schema import ChatCompletionRequest, ChatMessage

NEW_TOKENS = 64
EOS = 2
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 200},
    },
    "required": ["title", "tags"],
    "additionalProperties": False,
}
DOCUMENT = '{"title": "A walk in the park", "tags": ["trees", "grass", "birds", "benches", "ponds", "paths"'
QUESTION = "Describe a walk in the park as JSON with a title and many tags."


def request(constrained: bool) -> EngineRequest:
    fields: dict[str, Any] = (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "walk", "schema": SCHEMA}}}
        if constrained
        else {"logit_bias": {str(EOS): -100.0}}
    )
    params = ChatCompletionRequest(
        model="bench",
        messages=[ChatMessage(role="user", content=QUESTION)],
        temperature=0,
        max_tokens=NEW_TOKENS,
        **fields,
    )
    return EngineRequest(
        operation="chat", params=params, raw_body=b"", request_id="b", tenant_id="t", cache_salt=""
    )


def engine_run(engine: LocalEngine, mix: list[bool]) -> float:
    """All of `mix` (True: constrained) at once; wall ms per generated token."""

    async def go() -> tuple[float, int]:
        start = time.perf_counter()
        done = await asyncio.gather(*(engine.complete(request(c)) for c in mix))
        tokens = sum(d.usage.completion_tokens for d in done if d.usage is not None)
        return time.perf_counter() - start, tokens

    seconds, tokens = asyncio.run(go())
    return seconds * 1000 / tokens


def states(compiler: GrammarCompiler, loaded: LoadedModel, rows: int) -> list[GrammarState | None]:
    params = request(True).params
    assert isinstance(params, ChatCompletionRequest)
    grammar = compiler.compile(params, None)
    assert grammar is not None
    out: list[GrammarState | None] = []
    for _ in range(rows):
        state = grammar.start()
        for token in loaded.tokenizer.encode(DOCUMENT):
            state.advance(token)
        out.append(state)
    return out


def pool_us_per_row(compiler: GrammarCompiler, loaded: LoadedModel, rows: int, reps: int) -> float:
    """µs per row of the masks alone filled by llguidance's thread pool (`LLExecutor`), the
    alternative to `mask_rows`' one-row-after-another fill."""
    matchers = [(s.matcher, k) for k, s in enumerate(states(compiler, loaded, rows)) if s is not None]
    executor = llguidance.LLExecutor()
    bitmask = llguidance.numpy.allocate_token_bitmask(rows, loaded.spec.vocab_size)
    timings = []
    for _ in range(reps):
        start = time.perf_counter()
        llguidance.numpy.fill_next_token_bitmask_par(executor, matchers, bitmask)
        timings.append(time.perf_counter() - start)
    return statistics.median(timings) * 1e6 / rows


def fill_us_per_row(compiler: GrammarCompiler, loaded: LoadedModel, rows: int, reps: int) -> float:
    """µs per row of the masks alone, filled one row after another (as `mask_rows` does)."""
    matchers = [s.matcher for s in states(compiler, loaded, rows) if s is not None]
    bitmask = llguidance.numpy.allocate_token_bitmask(rows, loaded.spec.vocab_size)
    timings = []
    for _ in range(reps):
        start = time.perf_counter()
        for k, matcher in enumerate(matchers):
            llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, k)
        timings.append(time.perf_counter() - start)
    return statistics.median(timings) * 1e6 / rows


def mask_us_per_row(
    compiler: GrammarCompiler, loaded: LoadedModel, rows: int, reps: int
) -> tuple[float, float]:
    """(µs per constrained row, µs of the call with every row free) for a step of `rows` rows."""
    constrained = states(compiler, loaded, rows)
    free: list[GrammarState | None] = [None] * rows
    logits = torch.randn(rows, loaded.spec.vocab_size)
    timings: dict[str, list[float]] = {"constrained": [], "free": []}
    for _ in range(reps):
        for name, row_states in (("constrained", constrained), ("free", free)):
            step_logits = logits.clone()
            start = time.perf_counter()
            mask_rows(step_logits, row_states)
            timings[name].append(time.perf_counter() - start)
    return statistics.median(timings["constrained"]) * 1e6 / rows, statistics.median(timings["free"]) * 1e6


def _by_unpacked_bitmask(logits: torch.Tensor, states: list[GrammarState | None]) -> None:
    """The bitmask unpacked by numpy, filled by torch row by row (`mask_rows` before)."""
    rows = [(i, s) for i, s in enumerate(states) if s is not None]
    vocab = logits.shape[1]
    bitmask = llguidance.numpy.allocate_token_bitmask(len(rows), vocab)
    for k, (_, state) in enumerate(rows):
        llguidance.numpy.fill_next_token_bitmask(state.matcher, bitmask, k)
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    refused = torch.from_numpy(bits) == 0
    for k, (row, _) in enumerate(rows):
        logits[row].masked_fill_(refused[k], float("-inf"))


def _by_numpy_helpers(logits: torch.Tensor, states: list[GrammarState | None]) -> None:
    """llguidance.numpy's fill and apply (every row of the step is constrained here)."""
    bitmask = llguidance.numpy.allocate_token_bitmask(len(states), logits.shape[1])
    for k, state in enumerate(states):
        assert state is not None
        llguidance.numpy.fill_next_token_bitmask(state.matcher, bitmask, k)
    llguidance.numpy.apply_token_bitmask_inplace(logits.numpy(), bitmask)


def _by_torch_helpers(logits: torch.Tensor, states: list[GrammarState | None]) -> None:
    """llguidance.torch's fill and apply (every row of the step is constrained here)."""
    bitmask = llguidance.torch.allocate_token_bitmask(len(states), logits.shape[1])
    for k, state in enumerate(states):
        assert state is not None
        llguidance.torch.fill_next_token_bitmask(state.matcher, bitmask, k)
    llguidance.torch.apply_token_bitmask_inplace(logits, bitmask)


MASK_WAYS = {
    "mask_rows": mask_rows,
    "llguidance_numpy_helpers": _by_numpy_helpers,
    "llguidance_torch_helpers": _by_torch_helpers,
    "unpacked_bitmask_torch_fill": _by_unpacked_bitmask,
}


def mask_ways_us_per_row(
    compiler: GrammarCompiler, loaded: LoadedModel, rows: int, reps: int
) -> dict[str, float]:
    """µs per row of each way in `MASK_WAYS` on the same constrained rows, reps alternated; every
    way must refuse exactly the tokens `mask_rows` refuses."""
    constrained = states(compiler, loaded, rows)
    logits = torch.randn(rows, loaded.spec.vocab_size)
    expected = logits.clone()
    mask_rows(expected, constrained)
    timings: dict[str, list[float]] = {name: [] for name in MASK_WAYS}
    for name, way in MASK_WAYS.items():  # warm (torch.compile) and check
        step_logits = logits.clone()
        way(step_logits, constrained)
        assert torch.equal(torch.isinf(step_logits), torch.isinf(expected)), name
    for _ in range(reps):
        for name, way in MASK_WAYS.items():
            step_logits = logits.clone()
            start = time.perf_counter()
            way(step_logits, constrained)
            timings[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(t) * 1e6 / rows, 1) for name, t in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-c-kernels", action="store_true", help="torch's kernels (hosts without AVX-512)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = LocalEngineConfig(threads=args.threads, c_kernels=not args.no_c_kernels)
    loaded = load_model(config)
    engine = LocalEngine(config, model=loaded)
    engine.start_sync()
    compiler = GrammarCompiler(loaded.tokenizer, loaded.spec.vocab_size)
    result: dict[str, Any] = {
        "threads": args.threads,
        "c_kernels": config.c_kernels,
        "mask": {},
        "mask_ways": {},
        "engine": {},
    }
    for rows in (1, 4, 16):
        per_row, free = mask_us_per_row(compiler, loaded, rows, reps=50)
        result["mask"][rows] = {
            "us_per_constrained_row": round(per_row, 1),
            "us_all_free": round(free, 1),
            "fill_only_us_per_row": round(fill_us_per_row(compiler, loaded, rows, reps=50), 1),
            "fill_by_thread_pool_us_per_row": round(pool_us_per_row(compiler, loaded, rows, reps=50), 1),
        }
        result["mask_ways"][rows] = mask_ways_us_per_row(compiler, loaded, rows, reps=50)
    mixes = {
        "1 free": [False],
        "1 constrained": [True],
        "8 free": [False] * 8,
        "8 constrained": [True] * 8,
        "4 free + 4 constrained": [False, True] * 4,
    }
    engine_run(engine, [False, True])  # warm: the prompt's KV is cached for every later run
    samples: dict[str, list[float]] = {name: [] for name in mixes}
    for _ in range(args.reps):
        for name, mix in mixes.items():
            samples[name].append(engine_run(engine, mix))
    result["engine"] = {name: round(statistics.median(v), 2) for name, v in samples.items()}
    engine.close_sync()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
