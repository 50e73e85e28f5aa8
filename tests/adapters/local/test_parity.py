"""Our forward pass against `transformers` loading the same GGUF (fp32, greedy)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from adapters.local import LocalEngine
from adapters.local.forward_batch import ForwardBatch, PrefillSegment
from adapters.local.kv_pool import KVPool
from adapters.local.loader import LoadedModel
from adapters.local.sampling import SamplingParams

pytestmark = pytest.mark.slow

NEW_TOKENS = 32
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain recursion to a five-year-old.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish and German.",
    "What does the Python `zip` function do?",
    "Give me a tip for staying focused while studying.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "How many legs does a spider have? 🕷️",
]
TEXT_PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):\n    ",
    "In 1969, the first humans",
    "Once upon a time, in a kingdom far away,",
    "The three laws of thermodynamics are",
    "import numpy as np\n\narr = np.",
    "Paris est la capitale de",
    "Water boils at a temperature of",
    "A list of fruits: apple, banana,",
    "The café served crème brûlée and",
]


@pytest.fixture(scope="module")
def prompt_ids(hf_tokenizer: Any, loaded: LoadedModel) -> list[list[int]]:
    """Token ids of all 20 prompts; chat prompts go through our template and tokenizer."""
    from adapters.schema import ChatMessage

    ids = []
    for text in CHAT_PROMPTS:
        ours = loaded.tokenizer.encode(loaded.template.render([ChatMessage(role="user", content=text)]))
        theirs = hf_tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        assert ours == list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs)
        ids.append(ours)
    for text in TEXT_PROMPTS:
        ours = loaded.tokenizer.encode(text)
        assert ours == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.append(ours)
    return ids


def generate_all(engine: LocalEngine, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy continuations of all prompts, submitted together (so they share batches)."""
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)

    async def run() -> list[list[int]]:
        results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        return [r.token_ids for r in results]

    return asyncio.run(run())


@pytest.fixture(scope="module")
def ours(make_engine: Any, prompt_ids: list[list[int]]) -> list[list[int]]:
    return generate_all(make_engine(max_running=len(prompt_ids)), prompt_ids)


@pytest.fixture(scope="module")
def reference_logits(hf_model: Any, prompt_ids: list[list[int]], ours: list[list[int]]) -> list[torch.Tensor]:
    """`transformers`' logits over each prompt followed by our continuation (teacher forcing)."""
    out = []
    for prompt, generated in zip(prompt_ids, ours, strict=True):
        with torch.inference_mode():
            out.append(hf_model(torch.tensor([prompt + generated[:-1]])).logits[0])
    return out


def test_greedy_tokens_match_transformers(
    prompt_ids: list[list[int]], ours: list[list[int]], reference_logits: list[torch.Tensor]
) -> None:
    """At every step the reference's argmax, given the same prefix, is the token we chose: so its
    greedy decode yields our tokens, stopping (EOS) where we stop."""
    assert sum(len(g) for g in ours) >= len(ours) * NEW_TOKENS // 2
    for prompt, generated, logits in zip(prompt_ids, ours, reference_logits, strict=True):
        expected = logits[len(prompt) - 1 :].argmax(dim=-1).tolist()
        assert generated == expected


def prefill_logits(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Our last-position logits for `ids`, straight from the model on a scratch pool."""
    spec, page = loaded.spec, 16
    pool = KVPool(spec, num_pages=-(-len(ids) // page), page_size=page, dtype=torch.float32)
    pages = pool.alloc(pool.num_pages)
    assert pages is not None
    batch = ForwardBatch(
        token_ids=torch.tensor(ids),
        positions=torch.arange(len(ids)),
        slots=torch.tensor([pages[i // page] * page + i % page for i in range(len(ids))]),
        logit_rows=torch.tensor([len(ids) - 1]),
        prefills=[PrefillSegment(start=0, length=len(ids))],
    )
    with torch.inference_mode():
        return loaded.model.forward(batch, pool)[0]


def test_last_position_logits_within_tolerance(
    loaded: LoadedModel, prompt_ids: list[list[int]], reference_logits: list[torch.Tensor]
) -> None:
    for ids, logits in zip(prompt_ids, reference_logits, strict=True):
        assert torch.allclose(prefill_logits(loaded, ids), logits[len(ids) - 1], atol=1e-3, rtol=0)


def test_single_stream_decode_matches_transformers(
    make_engine: Any, prompt_ids: list[list[int]], hf_model: Any
) -> None:
    """One stream at a time, a decode step takes its own kernels (packed products of one row,
    attention over one run of pages, RMSNorm in C): its tokens must be the reference's too."""
    engine = make_engine()
    for prompt in prompt_ids[:3] + prompt_ids[10:13]:
        generated = generate_all(engine, [prompt])[0]
        with torch.inference_mode():
            logits = hf_model(torch.tensor([prompt + generated[:-1]])).logits[0]
        assert generated == logits[len(prompt) - 1 :].argmax(dim=-1).tolist()
