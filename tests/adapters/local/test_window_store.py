"""Window reuse through the offload tiers (`adapters.local.window_store`) on the tiny model: a kept
window evicted from memory comes back from L2, and after a restart from L3, and the next turn's
tokens equal those of the turn that found its kept window still in memory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from adapters.local import LocalEngine
from adapters.local.core import EngineStats
from tests.adapters.local.test_window_engine import PAGE, WINDOW, run

FIRST = [(7 * i) % 250 + 3 for i in range(100)]
NEW_TURN = [(11 * i) % 250 + 3 for i in range(20)]
EVICTOR = [(13 * i) % 250 + 3 for i in range(150)]
POOL = 12 * PAGE  # a kept window is 7 pages: the evictor's 10 pages need them


def stats(engine: LocalEngine) -> EngineStats:
    figures = engine.stats()
    assert figures is not None
    return figures


def two_turns(engine: LocalEngine, between: Callable[[], LocalEngine] | None = None) -> list[int]:
    """A windowed first turn, then (after `between`, which may swap the engine) the next turn,
    whose prompt is the whole history and a new message; the next turn's tokens."""
    [first] = run(engine, [FIRST], 60, sliding_window=True)
    assert stats(engine).window_kept_pages > 0  # the first turn slid: its kept window waits
    if between is not None:
        engine = between()
    [second] = run(engine, [FIRST + first.token_ids + NEW_TURN], 30, sliding_window=True)
    assert second.cached_tokens == len(FIRST) + 59  # the history but its last token
    return second.token_ids


def test_a_kept_window_evicted_from_memory_comes_back_from_l2(make_tiny: Callable[..., LocalEngine]) -> None:
    expected = two_turns(make_tiny(**WINDOW, kv_offload=True))
    engine = make_tiny(**WINDOW, kv_offload=True, kv_budget_tokens=POOL)
    got = two_turns(engine, between=lambda: evicted(engine))
    figures = stats(engine)
    assert got == expected
    assert figures.window_offloaded >= 1 and figures.window_loaded == 1 and figures.window_hits == 1


def evicted(engine: LocalEngine) -> LocalEngine:
    run(engine, [EVICTOR], 8)  # its pages push the kept window out of the pool
    assert stats(engine).window_kept_pages == 0 and stats(engine).window_offloaded >= 1
    return engine


def test_a_kept_window_outlives_a_restart_on_l3(
    make_tiny: Callable[..., LocalEngine], tmp_path: Path
) -> None:
    expected = two_turns(make_tiny(**WINDOW, kv_offload=True))
    first = make_tiny(**WINDOW, kv_offload=True, kv_offload_dir=tmp_path)

    restarted: list[LocalEngine] = []

    def restart() -> LocalEngine:
        first.close_sync()  # the kept window still in memory goes to L3
        restarted.append(make_tiny(**WINDOW, kv_offload=True, kv_offload_dir=tmp_path))
        return restarted[0]

    got = two_turns(first, between=restart)
    figures = stats(restarted[0])
    assert got == expected
    assert figures.window_loaded == 1 and figures.window_hits == 1


def test_a_window_with_another_history_is_not_reused(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny(**WINDOW, kv_offload=True, kv_budget_tokens=POOL)
    [first] = run(engine, [FIRST], 60, sliding_window=True)
    evicted(engine)
    other = list(FIRST)
    other[10] = other[10] % 250 + 4  # one token differs, long before the window
    run(engine, [other + first.token_ids + NEW_TURN], 4, sliding_window=True)
    assert stats(engine).window_loaded == 0
