"""The sliding window through `LocalEngine` on the tiny model (512-token context): past the
context, with sibling choices, under a tight pool, and the 400 without a window."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from adapters.errors import InvalidRequest
from adapters.local import LocalEngine
from adapters.local.engine import Generation
from tests.adapters.local.test_scheduler import greedy, prompts

WINDOW = {"window_size": 64, "window_sink_tokens": 4, "window_overlap": 16}
PAGE = 16


def run(engine: LocalEngine, batch: list[list[int]], max_tokens: int, **kwargs: bool) -> list[Generation]:
    async def go() -> list[Generation]:
        calls = (engine.generate(p, greedy(max_tokens), **kwargs) for p in batch)  # type: ignore[arg-type]
        return list(await asyncio.gather(*calls))

    return asyncio.run(go())


def test_past_the_context_only_with_the_window(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny(**WINDOW)
    prompt = prompts(1, 600, seed=11)[0]  # past the tiny model's 512-token context
    with pytest.raises(InvalidRequest):
        run(engine, [prompt], 8)
    [answer] = run(engine, [prompt], 200, sliding_window=True)
    assert len(answer.token_ids) == 200
    stats = engine.stats()
    assert stats is not None and stats.window_slid_pages > (600 + 200 - 64) // PAGE - 4
    assert stats.active_pages == 0 and stats.window_pages == 0


def test_sibling_choices_equal_a_single_windowed_choice(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny(**WINDOW, radix_cache=False)
    prompt = prompts(1, 150, seed=12)[0]
    [single] = run(engine, [prompt], 120, sliding_window=True)

    async def three() -> list[list[int]]:
        tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
        async for deltas in engine.generate_stream(prompt, greedy(120), n=3, sliding_window=True):
            for delta in deltas:
                tokens[delta.index].append(delta.token_id)
        return list(tokens.values())

    assert asyncio.run(three()) == [single.token_ids] * 3


def test_windows_in_a_tight_pool_still_finish(make_tiny: Callable[..., LocalEngine]) -> None:
    """Four windowed sequences in a pool that holds two windows: preempted ones come back (from
    their kept caches where they survive) and every one finishes; nothing leaks."""
    engine = make_tiny(**WINDOW, kv_budget_tokens=14 * PAGE)
    answers = run(engine, prompts(4, 20, seed=13), 150, sliding_window=True)
    assert [len(a.token_ids) for a in answers] == [150] * 4
    stats = engine.stats()
    assert stats is not None and stats.preemptions > 0 and stats.active_pages == 0
