"""Scheduling, paging and prefix reuse, on a tiny random model so each test takes milliseconds.

Greedy decoding of a fixed model is deterministic, so every scenario (preemption, forks,
eviction) is checked by comparing against the same prompts run where nothing interferes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from adapters.errors import EngineOverloaded
from adapters.local import LocalEngine
from adapters.local.engine import Generation
from adapters.local.sampling import SamplingParams

EOS = 2
PAGE = 16


def greedy(max_tokens: int) -> SamplingParams:
    # Random weights emit EOS at random; banning it makes every run generate max_tokens.
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, logit_bias=((EOS, -100.0),))


def prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 262) for _ in range(length)] for _ in range(count)]


def run(
    engine: LocalEngine, batch: list[list[int]], params: SamplingParams, salt: str = ""
) -> list[Generation]:
    async def go() -> list[Generation]:
        return list(await asyncio.gather(*(engine.generate(p, params, salt=salt) for p in batch)))

    return asyncio.run(go())


async def wait_for(engine: LocalEngine, predicate: Callable[[Any], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + 10.0
    while not predicate(engine.stats()):
        assert asyncio.get_running_loop().time() < deadline, engine.stats()
        await asyncio.sleep(0.01)


def test_preempted_sequences_resume_with_identical_output(make_tiny: Callable[..., LocalEngine]) -> None:
    batch = prompts(4, 20)
    # A float32 pool: a preempted sequence's KV is recomputed by a prompt chunk, not the decode rows
    # that first wrote it, and a half pool's rounding can flip the random tiny model's near ties.
    roomy = run(make_tiny(kv_dtype="float32"), batch, greedy(40))
    tight = make_tiny(kv_budget_tokens=6 * PAGE, kv_dtype="float32")  # four 60-token sequences need 16
    squeezed = run(tight, batch, greedy(40))
    assert [g.token_ids for g in squeezed] == [g.token_ids for g in roomy]
    stats = tight.stats()
    assert stats is not None and stats.preemptions > 0
    assert stats.active_pages == 0


@pytest.mark.parametrize("radix_cache", [True, False])
def test_n_choices_share_the_prompt_and_match_a_single_choice(
    make_tiny: Callable[..., LocalEngine], radix_cache: bool
) -> None:
    engine = make_tiny(radix_cache=radix_cache)
    prompt = prompts(1, 21, seed=5)[0]  # 21 tokens: the shared last page is partial and must be copied
    single = run(engine, [prompt], greedy(12))[0].token_ids

    async def three() -> list[list[int]]:
        out: list[list[int]] = [[], [], []]
        async for deltas in engine.generate_stream(prompt, greedy(12), n=3):
            for delta in deltas:
                out[delta.index].append(delta.token_id)
        return out

    assert asyncio.run(three()) == [single] * 3
    stats = engine.stats()
    assert stats is not None and stats.active_pages == 0


def test_a_repeated_prefix_is_served_from_the_cache(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny()
    prefix = prompts(1, 64, seed=1)[0]
    first = run(engine, [[*prefix, 10, 11, 12]], greedy(8))[0]
    second = run(engine, [[*prefix, 20, 21, 22]], greedy(8))[0]
    uncached = run(make_tiny(radix_cache=False), [[*prefix, 20, 21, 22]], greedy(8))[0]
    assert first.cached_tokens == 0
    assert second.cached_tokens == 64
    assert uncached.cached_tokens == 0 and uncached.token_ids == second.token_ids


def test_tenants_never_share_cached_prefixes(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny()
    prompt = prompts(1, 48, seed=2)[0]
    run(engine, [prompt], greedy(4), salt="tenant-a")
    assert run(engine, [prompt], greedy(4), salt="tenant-b")[0].cached_tokens == 0
    assert run(engine, [prompt], greedy(4), salt="tenant-a")[0].cached_tokens == 32
    assert run(engine, [prompt], greedy(4), salt="")[0].cached_tokens == 0


@pytest.mark.parametrize(("policy", "survivor"), [("lru", "a"), ("fifo", "b")])
def test_eviction_policy_picks_the_victim(
    make_tiny: Callable[..., LocalEngine], policy: str, survivor: str
) -> None:
    # Two cached 64-token prompts (8 pages) and a running 65-token one (5 pages) need 13 of 12 pages.
    engine = make_tiny(kv_budget_tokens=12 * PAGE, eviction_policy=policy)
    a, b, c = prompts(3, 64, seed=3)
    run(engine, [[*a, 5]], greedy(1))
    run(engine, [[*b, 5]], greedy(1))
    run(engine, [[*a, 6]], greedy(1))  # touches a: newer than b for LRU, still older for FIFO
    run(engine, [[*c, 5]], greedy(1))  # needs pages: one cached prompt goes
    victim = "b" if survivor == "a" else "a"
    cached = {"a": a, "b": b}
    assert run(engine, [cached[survivor] + [7]], greedy(1))[0].cached_tokens == 64
    assert run(engine, [cached[victim] + [7]], greedy(1))[0].cached_tokens == 0
    stats = engine.stats()
    assert stats is not None and stats.evicted_tokens > 0


def test_cached_tokens_respect_the_cap(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny(max_cached_tokens=48)
    run(engine, prompts(4, 40, seed=4), greedy(10))
    stats = engine.stats()
    assert stats is not None and 0 < stats.cached_tokens <= 48


def test_a_full_queue_answers_engine_overloaded(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny(max_running=1, max_queued=1)
    first, second, third = prompts(3, 8, seed=6)

    async def go() -> None:
        running = asyncio.ensure_future(engine.generate(first, greedy(400)))
        await wait_for(engine, lambda s: s.running == 1)
        waiting = asyncio.ensure_future(engine.generate(second, greedy(4)))
        await wait_for(engine, lambda s: s.waiting == 1)
        with pytest.raises(EngineOverloaded) as raised:
            await engine.generate(third, greedy(4))
        assert raised.value.status == 503
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        assert (await waiting).finish_reason == "length"

    asyncio.run(go())


def test_cancelling_a_generation_frees_its_pages(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny(radix_cache=False)

    async def go() -> None:
        task = asyncio.ensure_future(engine.generate(prompts(1, 30, seed=7)[0], greedy(450)))
        await wait_for(engine, lambda s: s.active_pages >= 3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await wait_for(engine, lambda s: s.active_pages == 0 and s.pool_pages_free == s.pool_pages_total)

    asyncio.run(go())


def test_flush_cache_drops_cached_prefixes(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny()
    prompt = prompts(1, 40, seed=8)[0]
    run(engine, [prompt], greedy(2))

    async def flush() -> bool:
        return await engine.flush_cache()

    assert asyncio.run(flush())
    stats = engine.stats()
    assert stats is not None and stats.cached_tokens == 0 and stats.pool_pages_free == stats.pool_pages_total
    assert run(engine, [prompt], greedy(2))[0].cached_tokens == 0


def test_requests_arriving_together_wait_for_a_shared_prefix(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny()
    shared = prompts(1, 96, seed=9)[0]
    batch = [[*shared, *tail] for tail in prompts(4, 8, seed=10)]
    results = run(engine, batch, greedy(4))
    assert sorted(g.cached_tokens for g in results) == [0, 96, 96, 96]
    alone = run(make_tiny(radix_cache=False), batch, greedy(4))
    assert [g.token_ids for g in results] == [g.token_ids for g in alone]
