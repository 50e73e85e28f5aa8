"""The engine's shortcuts change nothing: cached == uncached, batched == single, chunked == whole
prefill, n choices == one choice (greedy, the real model, token ids compared)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest

from adapters.local import LocalEngine
from adapters.local.engine import Generation
from adapters.local.linear import DenseLinear
from adapters.local.loader import LoadedModel, load_model
from adapters.local.sampling import SamplingParams
from adapters.schema import ChatMessage
from tests.adapters.local.conftest import TEST_CONFIG

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
DOCUMENT = (
    "Radix trees store strings by their shared prefixes. Each edge holds a run of symbols, and a "
    "lookup walks from the root, matching as far as it can. Serving engines use them to find the "
    "longest prompt prefix whose attention keys and values were already computed, so a new request "
    "only pays for its own suffix. Eviction removes leaves that were not used recently. "
) * 4


def chat_ids(loaded: LoadedModel, question: str) -> list[int]:
    messages = [ChatMessage(role="system", content=DOCUMENT), ChatMessage(role="user", content=question)]
    return loaded.tokenizer.encode(loaded.template.render(messages))


def run(engine: LocalEngine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[Generation]:
    async def go() -> list[Generation]:
        return list(await asyncio.gather(*(engine.generate(p, params) for p in prompts)))

    return asyncio.run(go())


def test_cached_prefix_gives_the_uncached_answer(
    make_engine: Callable[..., LocalEngine], loaded: LoadedModel
) -> None:
    cached, uncached = make_engine(radix_cache=True), make_engine(radix_cache=False)
    warm = chat_ids(loaded, "What do radix trees store?")
    probe = chat_ids(loaded, "Why do serving engines use them?")
    first = run(cached, [warm])[0]
    hit = run(cached, [probe])[0]
    cold = run(uncached, [probe])[0]
    assert first.cached_tokens == 0 and cold.cached_tokens == 0
    assert hit.cached_tokens >= 256
    assert hit.token_ids == cold.token_ids
    again = run(cached, [warm])[0]
    assert again.cached_tokens >= len(warm) - 16 and again.token_ids == first.token_ids


def test_batched_equals_single(engine: LocalEngine, loaded: LoadedModel) -> None:
    questions = ["Summarize the text.", "What is evicted first?", "Name one use.", "Define prefix."]
    prompts = [loaded.tokenizer.encode(q * (i + 1)) for i, q in enumerate(questions)]
    prompts.append(chat_ids(loaded, "What does a lookup do?"))
    singles = [run(engine, [p])[0].token_ids for p in prompts]
    together = [g.token_ids for g in run(engine, prompts)]
    assert together == singles


def test_chunked_prefill_equals_whole_prefill(
    make_engine: Callable[..., LocalEngine], loaded: LoadedModel
) -> None:
    prompt = chat_ids(loaded, "Explain the eviction rule.")
    assert len(prompt) > 300
    whole = run(make_engine(radix_cache=False, max_prefill_tokens=4096), [prompt])[0]
    # 50-token chunks straddle pages; idle steps chunk too, so every step of this prompt is chunked.
    chunked_engine = make_engine(radix_cache=False, max_prefill_tokens=50, max_idle_prefill_tokens=50)
    short = loaded.tokenizer.encode("Count: one, two,")
    chunked, decoding = run(chunked_engine, [prompt, short], SamplingParams(max_tokens=24, temperature=0.0))
    assert chunked.token_ids == whole.token_ids
    assert decoding.token_ids == run(chunked_engine, [short])[0].token_ids


def test_n_choices_equal_one_choice_under_greedy(engine: LocalEngine, loaded: LoadedModel) -> None:
    from tests.adapters.local.conftest import chat

    async def go() -> tuple[str, list[str]]:
        one = await engine.complete(chat("Name a color.", temperature=0, max_tokens=12))
        three = await engine.complete(chat("Name a color.", temperature=0, max_tokens=12, n=3))
        import json

        single = json.loads(one.body)["choices"][0]["message"]["content"]
        return single, [c["message"]["content"] for c in json.loads(three.body)["choices"]]

    single, choices = asyncio.run(go())
    assert choices == [single] * 3


def test_dense_fallback_gives_the_kernels_answer(c_kernel_loaded: LoadedModel) -> None:
    """Where the C kernels cannot build, the same GGUF runs as dense fp32 weights through torch:
    the same greedy answer as the kernels' (their portable build on a CPU without AVX-512), single
    stream and batched."""
    dense_model = load_model(replace(TEST_CONFIG, c_kernels=False, decode_weights="fp32"))
    assert isinstance(dense_model.model.layers[0].wqkv, DenseLinear)
    dense = LocalEngine(replace(TEST_CONFIG, c_kernels=False, decode_weights="fp32"), model=dense_model)
    kernel = LocalEngine(TEST_CONFIG, model=c_kernel_loaded)
    dense.start_sync()
    kernel.start_sync()
    try:
        prompts = [
            chat_ids(c_kernel_loaded, "What do radix trees store?"),
            c_kernel_loaded.tokenizer.encode("Eviction removes"),
        ]
        assert [g.token_ids for g in run(dense, prompts)] == [g.token_ids for g in run(kernel, prompts)]
        assert run(dense, prompts[:1])[0].token_ids == run(kernel, prompts[:1])[0].token_ids
    finally:
        dense.close_sync()
        kernel.close_sync()
