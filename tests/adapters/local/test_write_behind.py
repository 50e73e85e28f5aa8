"""Write-behind on a tiny random model: cached pages (never evicted) reach L3 by the documented rule,
the shutdown flush writes the rest within `kv_shutdown_flush_s`, and a restart reuses them.

Every reuse is compared with the prompt computed from scratch, so a page that read back different
from its recomputation would show as different tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.local import LocalEngine
from adapters.local.engine import Generation
from adapters.local.offload import L2_TIER, L3_TIER
from tests.adapters.local.test_offload import EVICTORS, POOL, evict, offload_stats, tier_hits
from tests.adapters.local.test_scheduler import PAGE, greedy, prompts, run

PROMPT = prompts(1, 64, seed=21)[0]  # 4 pages; 3 whole ones are reusable (the last token is computed)
NEVER = 1e9


@pytest.fixture(scope="module")
def reference(make_tiny: Callable[..., LocalEngine]) -> Generation:
    (generation,) = run(make_tiny(radix_cache=False), [PROMPT], greedy(8))
    return generation


def written(engine: LocalEngine, at_least: int, within_s: float = 10.0) -> int:
    """Pages written behind, once at least `at_least` are (or the wait is over)."""
    deadline = time.monotonic() + within_s
    while True:
        count = offload_stats(engine).written_behind_pages
        if count >= at_least or time.monotonic() > deadline:
            return count
        time.sleep(0.02)


def test_a_page_used_twice_is_written_behind(make_tiny: Callable[..., LocalEngine], tmp_path: Path) -> None:
    engine = make_tiny(kv_offload=True, kv_offload_dir=tmp_path, kv_write_behind_after_s=NEVER)
    run(engine, [PROMPT], greedy(4))
    time.sleep(0.2)
    assert offload_stats(engine).written_behind_pages == 0  # used once, and young
    (again,) = run(engine, [PROMPT], greedy(4))
    assert again.cached_tokens == 3 * PAGE
    assert written(engine, 3) >= 3
    assert offload_stats(engine).offloaded_pages == 0  # nothing was evicted: these are cached pages


def test_a_page_cached_long_enough_is_written_behind(
    make_tiny: Callable[..., LocalEngine], tmp_path: Path
) -> None:
    engine = make_tiny(kv_offload=True, kv_offload_dir=tmp_path, kv_write_behind_after_s=0.1)
    run(engine, [PROMPT], greedy(4))
    assert written(engine, 4) >= 4  # the prompt's pages and the answer's
    assert offload_stats(engine).write_behind_pending_pages == 0


def test_shutdown_flush_makes_a_restart_reuse_the_prefix(
    make_tiny: Callable[..., LocalEngine], reference: Generation, tmp_path: Path
) -> None:
    first = make_tiny(kv_offload=True, kv_offload_dir=tmp_path, kv_write_behind_after_s=NEVER)
    run(first, [PROMPT], greedy(8))
    assert offload_stats(first).write_behind_pending_pages >= 3
    first.close_sync()  # the flush writes the cached pages

    restarted = make_tiny(kv_offload=True, kv_offload_dir=tmp_path)
    (again,) = run(restarted, [PROMPT], greedy(8))
    assert again.cached_tokens == 3 * PAGE
    assert again.token_ids == reference.token_ids
    assert tier_hits(offload_stats(restarted), L3_TIER) == 3


def test_shutdown_flush_is_bounded_by_its_setting(
    make_tiny: Callable[..., LocalEngine], reference: Generation, tmp_path: Path
) -> None:
    first = make_tiny(
        kv_offload=True, kv_offload_dir=tmp_path, kv_write_behind_after_s=NEVER, kv_shutdown_flush_s=0.0
    )
    run(first, [PROMPT], greedy(8))
    first.close_sync()  # no time at all: nothing is written

    restarted = make_tiny(kv_offload=True, kv_offload_dir=tmp_path)
    (again,) = run(restarted, [PROMPT], greedy(8))
    assert again.cached_tokens == 0
    assert again.token_ids == reference.token_ids


def test_write_behind_off_writes_only_evicted_pages(
    make_tiny: Callable[..., LocalEngine], tmp_path: Path
) -> None:
    first = make_tiny(kv_offload=True, kv_offload_dir=tmp_path, kv_write_behind_after_s=None)
    run(first, [PROMPT], greedy(4))
    run(first, [PROMPT], greedy(4))
    first.close_sync()
    restarted = make_tiny(kv_offload=True, kv_offload_dir=tmp_path)
    (again,) = run(restarted, [PROMPT], greedy(4))
    assert again.cached_tokens == 0


def test_a_page_written_behind_then_evicted_reloads_from_memory(
    make_tiny: Callable[..., LocalEngine], reference: Generation, tmp_path: Path
) -> None:
    engine = make_tiny(
        kv_budget_tokens=POOL, kv_offload=True, kv_offload_dir=tmp_path, kv_write_behind_after_s=0
    )
    run(engine, [PROMPT], greedy(8))
    assert written(engine, 3) >= 3
    evict(engine, EVICTORS[:2])
    (again,) = run(engine, [PROMPT], greedy(8))
    assert again.cached_tokens == 3 * PAGE
    assert again.token_ids == reference.token_ids
    assert tier_hits(offload_stats(engine), L2_TIER) >= 3  # eviction kept a memory copy too
