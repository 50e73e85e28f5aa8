"""KV offload with the real model (SmolLM2-135M, fp32): reloaded pages give the same greedy tokens.

About 10 s on an idle box: short prompts, a 10-page pool, 6 generated tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.local import LocalEngine
from adapters.local.loader import LoadedModel
from adapters.local.offload import L2_TIER, L3_TIER
from adapters.local.sampling import SamplingParams
from tests.adapters.local.test_scheduler import run

pytestmark = pytest.mark.slow

PAGE = 16
TEXT = (
    "The lighthouse keeper wrote in his log every evening: the wind, the colour of the sea, the ships "
    "that passed and the ones that did not. Tonight he wrote that a storm was coming from the west."
)
OTHERS = [
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside the leaves.",
    "A binary search halves the interval at each step, so it needs about log2(n) comparisons.",
]


def greedy() -> SamplingParams:
    return SamplingParams(max_tokens=6, temperature=0.0)


def hits(engine: LocalEngine, tier: str) -> int:
    stats = engine.kv_offload_stats()
    assert stats is not None
    return next(t.hits for t in stats.store.tiers if t.name == tier)


def test_reloaded_pages_answer_like_recomputation(
    make_engine: Callable[..., LocalEngine], loaded: LoadedModel, tmp_path: Path
) -> None:
    prompt = loaded.tokenizer.encode(TEXT)
    others = [loaded.tokenizer.encode(text) * 4 for text in OTHERS]  # ~6 pages each
    whole = (len(prompt) - 1) // PAGE * PAGE
    (reference,) = run(make_engine(radix_cache=False), [prompt], greedy())

    options = {"kv_budget_tokens": 10 * PAGE, "kv_offload": True, "kv_offload_dir": tmp_path}
    engine = make_engine(**options)
    run(engine, [prompt], greedy())
    for other in others:  # each fills the pool: the prompt's pages go to L2 and L3
        run(engine, [other], greedy())
    (from_memory,) = run(engine, [prompt], greedy())
    assert from_memory.cached_tokens == whole and hits(engine, L2_TIER) >= whole // PAGE
    assert from_memory.token_ids == reference.token_ids
    for other in others:
        run(engine, [other], greedy())
    engine.close_sync()

    restarted = make_engine(**options)
    (from_disk,) = run(restarted, [prompt], greedy())
    assert from_disk.cached_tokens == whole and hits(restarted, L3_TIER) == whole // PAGE
    assert from_disk.token_ids == reference.token_ids
