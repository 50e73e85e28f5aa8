"""Speculative decoding changes no greedy token: with and without it, over copy-heavy and fresh
prompts, alone and batched (rows with drafts beside rows without), several draft lengths, both
kernel paths, and the sampling features that read each token (stop strings, logprobs, penalties).
Also: the radix tree's drafts, page accounting after rejected drafts, and the counters."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest

from adapters.local import LocalEngine
from adapters.local.engine import Generation
from adapters.local.loader import LoadedModel, load_model
from adapters.local.sampling import SamplingParams
from adapters.schema import ChatMessage
from tests.adapters.local.conftest import TEST_CONFIG

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=40, temperature=0.0)
CODE = (
    "class Counter:\n    def __init__(self, start=0):\n        self.value = start\n\n"
    "    def increment(self, step=1):\n        self.value = self.value + step\n        return self.value\n"
)
ARTICLE = (
    "The city council voted on Tuesday to extend the night bus network. Routes N4 and N7 will run "
    "every twenty minutes until 3 a.m. from June 1, and a new route will connect the harbour with "
    "the university campus."
)
QUESTIONS = [
    "Rename the attribute `value` to `count`. Reply with the whole class only.\n\n" + CODE,
    "Repeat the following text exactly as written.\n\n" + ARTICLE,
    "Write a short poem about rain.",
    "Why do cats purr?",
]


def chat_ids(loaded: LoadedModel, text: str) -> list[int]:
    return loaded.tokenizer.encode(loaded.template.render([ChatMessage(role="user", content=text)]))


def run(
    engine: LocalEngine, prompts: list[list[int]], speculate: bool | None, params: SamplingParams = GREEDY
) -> list[Generation]:
    async def go() -> list[Generation]:
        calls = (engine.generate(p, params, speculate=speculate) for p in prompts)
        return list(await asyncio.gather(*calls))

    return asyncio.run(go())


@pytest.mark.parametrize("max_draft_tokens", [1, 3, 16])
def test_speculation_gives_the_greedy_tokens(
    make_engine: Callable[..., LocalEngine], loaded: LoadedModel, max_draft_tokens: int
) -> None:
    engine = make_engine(radix_cache=False, max_draft_tokens=max_draft_tokens)
    prompts = [chat_ids(loaded, q) for q in QUESTIONS]
    plain = [g.token_ids for g in run(engine, prompts, speculate=False)]
    assert [g.token_ids for g in run(engine, prompts, speculate=True)] == plain  # batched
    alone = [run(engine, [p], speculate=True)[0] for p in prompts[:2]]
    assert [g.token_ids for g in alone] == plain[:2]
    assert all(g.accepted_drafts > 0 for g in alone)  # the copying prompts did take drafts
    stats = engine.stats()
    assert stats is not None and stats.speculation is not None
    assert stats.speculation.accepted_tokens > 0
    assert stats.pool_pages_free == stats.pool_pages_total  # rejected drafts' pages all came back


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=30, temperature=0.0, stop=("self",)),
        SamplingParams(max_tokens=30, temperature=0.0, logprobs=True, top_logprobs=2),
        SamplingParams(max_tokens=30, temperature=0.0, repetition_penalty=1.2, frequency_penalty=0.3),
        SamplingParams(max_tokens=7, temperature=0.0, logit_bias=((198, 2.0),)),
    ],
    ids=["stop", "logprobs", "penalties", "short-bias"],
)
def test_speculation_keeps_what_reads_each_token(
    engine: LocalEngine, loaded: LoadedModel, params: SamplingParams
) -> None:
    prompts = [chat_ids(loaded, q) for q in QUESTIONS[:2]]
    plain = run(engine, prompts, speculate=False, params=params)
    spec = run(engine, prompts, speculate=True, params=params)
    assert [g.token_ids for g in spec] == [g.token_ids for g in plain]
    assert [g.text for g in spec] == [g.text for g in plain]
    assert [g.finish_reason for g in spec] == [g.finish_reason for g in plain]
    assert all(len(g.token_ids) <= params.max_tokens for g in spec)


def test_radix_tree_drafts_an_earlier_answer(
    make_engine: Callable[..., LocalEngine], loaded: LoadedModel
) -> None:
    engine = make_engine(draft_sources=("radix",))
    prompt = chat_ids(loaded, QUESTIONS[2])
    first = run(engine, [prompt], speculate=False)[0]
    again = run(engine, [prompt], speculate=True)[0]
    assert again.token_ids == first.token_ids
    stats = engine.stats()
    assert stats is not None and stats.speculation is not None
    sources = dict(stats.speculation.sources)
    # The first answer's whole pages are in the tree: drafted from there, and accepted.
    assert sources["radix"].accepted_tokens >= 16 and sources["prompt"].drafts == 0
    assert again.accepted_drafts == sources["radix"].accepted_tokens


def test_speculation_off_drafts_nothing(make_engine: Callable[..., LocalEngine], loaded: LoadedModel) -> None:
    engine = make_engine(speculative=False)
    result = run(engine, [chat_ids(loaded, QUESTIONS[1])], speculate=None)[0]
    stats = engine.stats()
    assert stats is not None and stats.speculation is not None
    assert result.accepted_drafts == 0 and stats.speculation.drafted_tokens == 0


def test_torch_kernels_give_the_same_tokens_with_speculation(loaded: LoadedModel) -> None:
    """The path of hosts without the C kernels (torch's kernels, fp32 weights) verifies drafts as its
    own decode rows too. (Its default packed weights take bf16 activations, whose rounding can flip
    a near tie between batch shapes, with or without speculation: exactness is an fp32 promise.)"""
    config = replace(TEST_CONFIG, c_kernels=False, decode_weights="fp32", radix_cache=False)
    engine = LocalEngine(config, model=load_model(config))
    engine.start_sync()
    try:
        prompts = [chat_ids(loaded, q) for q in QUESTIONS[:3]]
        plain = [g.token_ids for g in run(engine, prompts, speculate=False)]
        spec = run(engine, prompts, speculate=True)
        assert [g.token_ids for g in spec] == plain
        assert sum(g.accepted_drafts for g in spec) > 0
    finally:
        engine.close_sync()


def test_sampled_requests_speculate_unless_seeded(engine: LocalEngine, loaded: LoadedModel) -> None:
    prompt = chat_ids(loaded, QUESTIONS[1])
    sampled = run(engine, [prompt], speculate=True, params=SamplingParams(max_tokens=40, temperature=0.3))[0]
    assert len(sampled.token_ids) == 40 or sampled.finish_reason == "stop"
    assert sampled.accepted_drafts > 0  # a low temperature copies the text, and takes the drafts
    seeded = SamplingParams(max_tokens=20, temperature=0.8, seed=5)
    with_seed = run(engine, [prompt], speculate=True, params=seeded)[0]
    assert with_seed.accepted_drafts == 0
    assert with_seed.token_ids == run(engine, [prompt], speculate=False, params=seeded)[0].token_ids
