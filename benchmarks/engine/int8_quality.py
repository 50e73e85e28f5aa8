"""How far `prefill_activations = "int8"` (the default) moves the model from the exact fp32 mode.

Twenty prompts of ~1,000 tokens (the parity tests' ten chat questions and ten text openings, each
after the first 3,000 characters of `docs/architecture.md`), so every prompt's chunks take the
int8 products. For each: the last position's logits in both modes (largest absolute difference,
same top token or not), and 32 greedy tokens from an engine in each mode (identical or not, and
where the differing ones part).

    .venv/bin/python -m benchmarks.engine.int8_quality --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from adapters.local import LocalEngine, LocalEngineConfig
from adapters.local.forward_batch import ForwardBatch, PrefillSegment
from adapters.local.kv_pool import KVPool
from adapters.local.linear import EXACT_PROMPT_TOKENS
from adapters.local.loader import LoadedModel, load_model
from adapters.local.sampling import SamplingParams
from adapters.schema import ChatMessage
from tests.adapters.local.test_parity import CHAT_PROMPTS, TEXT_PROMPTS

CONTEXT_FILE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
CONTEXT_CHARS = 3000
NEW_TOKENS = 32


def prompts(loaded: LoadedModel) -> list[list[int]]:
    context = CONTEXT_FILE.read_text()[:CONTEXT_CHARS]
    tokenizer, template = loaded.tokenizer, loaded.template
    chats = [
        template.render([ChatMessage(role="system", content=context), ChatMessage(role="user", content=text)])
        for text in CHAT_PROMPTS
    ]
    texts = [f"{context}\n\n{text}" for text in TEXT_PROMPTS]
    return [tokenizer.encode(t) for t in chats + texts]


def last_logits(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """The prompt's last-position logits from one whole-prompt forward."""
    model, count = loaded.model, len(ids)
    pool = KVPool(model.spec, count // 16 + 2, 16, model.dtype)
    batch = ForwardBatch(
        token_ids=torch.tensor(ids),
        positions=torch.arange(count),
        slots=torch.arange(count),
        logit_rows=torch.tensor([count - 1]),
        prefills=[PrefillSegment(0, count, int8=count > EXACT_PROMPT_TOKENS)],
    )
    with torch.inference_mode():
        return model.forward(batch, pool)[0]


def greedy(config: LocalEngineConfig, loaded: LoadedModel, batch: list[list[int]]) -> list[list[int]]:
    engine = LocalEngine(config, model=loaded)
    engine.start_sync()
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)

    async def go() -> list[list[int]]:
        return [(await engine.generate(ids, params)).token_ids for ids in batch]

    try:
        return asyncio.run(go())
    finally:
        engine.close_sync()


def _first_difference(a: list[int], b: list[int]) -> int:
    """Index of the first token where `a` and `b` differ (or where the shorter one ends)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = LocalEngineConfig(threads=args.threads)
    configs = {mode: replace(base, prefill_activations=mode) for mode in ("int8", "fp32")}
    models = {mode: load_model(config) for mode, config in configs.items()}
    batch = prompts(models["fp32"])
    diffs, same_top = [], 0
    for ids in batch:
        int8, exact = last_logits(models["int8"], ids), last_logits(models["fp32"], ids)
        diffs.append((int8 - exact).abs().max().item())
        same_top += int(int8.argmax() == exact.argmax())
    answers = {mode: greedy(configs[mode], models[mode], batch) for mode in configs}
    pairs = list(zip(answers["int8"], answers["fp32"], strict=True))
    identical = sum(a == b for a, b in pairs)
    # Where the differing answers part: the index of their first different token.
    parted = [_first_difference(a, b) for a, b in pairs if a != b]
    print(
        json.dumps(
            {
                "prompts": len(batch),
                "prompt_tokens": [min(map(len, batch)), max(map(len, batch))],
                "logits_max_abs_diff": {"median": statistics.median(diffs), "max": max(diffs)},
                "same_top_token": same_top,
                "greedy_answers_identical": identical,
                "first_different_token": parted,
                "new_tokens": NEW_TOKENS,
            }
        )
    )


if __name__ == "__main__":
    main()
