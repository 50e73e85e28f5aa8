"""KV offload on a tiny random model: evicted pages come back from L2 and, after a restart, from L3.

Every scenario compares greedy tokens with the same prompt run on an engine without any cache, so
a loaded page that differed from its recomputation would show as different output.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.local import LocalEngine, LocalEngineConfig
from adapters.local.engine import Generation
from adapters.local.kv_pool import dtype_name, kv_dtype
from adapters.local.loader import LoadedModel
from adapters.local.offload import L2_TIER, L3_TIER, OffloadStats
from cachelayer.keys import KeySeed, block_hashes
from tests.adapters.local.test_scheduler import PAGE, greedy, prompts, run

POOL = 8 * PAGE  # one 64-token prompt plus its answer fills 5 of the 8 pages
PROMPT, EVICTORS = prompts(1, 64, seed=11)[0], prompts(4, 64, seed=12)


def offload_stats(engine: LocalEngine) -> OffloadStats:
    stats = engine.kv_offload_stats()
    assert stats is not None
    return stats


def tier_hits(stats: OffloadStats, name: str) -> int:
    return next(t.hits for t in stats.store.tiers if t.name == name)


def evict(engine: LocalEngine, batch: list[list[int]]) -> None:
    """Run other prompts, one at a time (no preemption), through the small pool: earlier pages leave it."""
    for prompt in batch:
        run(engine, [prompt], greedy(4))


@pytest.fixture(scope="module")
def reference(make_tiny: Callable[..., LocalEngine]) -> Generation:
    """The prompt computed from scratch."""
    (generation,) = run(make_tiny(radix_cache=False), [PROMPT], greedy(8))
    return generation


def test_prefix_evicted_to_memory_is_loaded_back_token_identical(
    make_tiny: Callable[..., LocalEngine], reference: Generation
) -> None:
    engine = make_tiny(kv_budget_tokens=POOL, kv_offload=True)
    (cold,) = run(engine, [PROMPT], greedy(8))
    evict(engine, EVICTORS[:2])
    assert offload_stats(engine).offloaded_pages >= 4
    (warm,) = run(engine, [PROMPT], greedy(8))
    assert cold.cached_tokens == 0
    assert warm.cached_tokens == 3 * PAGE  # every whole page of the prompt but its last token
    assert warm.token_ids == cold.token_ids == reference.token_ids
    stats = offload_stats(engine)
    assert stats.loaded_pages >= 3 and tier_hits(stats, L2_TIER) >= 3
    assert [t.name for t in stats.store.tiers] == [L2_TIER]


def test_offloaded_pages_stay_with_their_tenant(make_tiny: Callable[..., LocalEngine]) -> None:
    engine = make_tiny(kv_budget_tokens=POOL, kv_offload=True)
    run(engine, [PROMPT], greedy(4), salt="tenant-a")
    evict(engine, EVICTORS[:2])
    (other,) = run(engine, [PROMPT], greedy(4), salt="tenant-b")
    assert other.cached_tokens == 0
    evict(engine, EVICTORS[2:])
    (same,) = run(engine, [PROMPT], greedy(4), salt="tenant-a")
    assert same.cached_tokens == 3 * PAGE


def test_prefix_offloaded_to_disk_is_reused_after_a_restart(
    make_tiny: Callable[..., LocalEngine], reference: Generation, tmp_path: Path
) -> None:
    first = make_tiny(kv_budget_tokens=POOL, kv_offload=True, kv_offload_dir=tmp_path)
    run(first, [PROMPT], greedy(8))
    evict(first, EVICTORS[:2])
    first.close_sync()  # drains the disk writer and releases the directory
    assert stored_files(tmp_path)

    restarted = make_tiny(kv_budget_tokens=POOL, kv_offload=True, kv_offload_dir=tmp_path)
    (again,) = run(restarted, [PROMPT], greedy(8))
    assert again.cached_tokens == 3 * PAGE
    assert again.token_ids == reference.token_ids
    assert tier_hits(offload_stats(restarted), L3_TIER) == 3


def stored_files(directory: Path) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file() and path.name != ".lock"]


def find_record(directory: Path, key: bytes) -> tuple[Path, int]:
    """The file holding the record of `key`, and where its data starts (the disk tier stores each
    record's key right before its data)."""
    for path in stored_files(directory):
        at = path.read_bytes().find(key)
        if at >= 0:
            return path, at + len(key)
    raise AssertionError("no stored record carries the key")


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_page_file_is_a_miss(
    make_tiny: Callable[..., LocalEngine],
    tiny_model: tuple[LocalEngineConfig, LoadedModel],
    reference: Generation,
    tmp_path: Path,
    damage: str,
) -> None:
    first = make_tiny(kv_budget_tokens=POOL, kv_offload=True, kv_offload_dir=tmp_path)
    run(first, [PROMPT], greedy(8))
    evict(first, EVICTORS[:2])
    first.close_sync()
    config, model = tiny_model
    pool_dtype = dtype_name(kv_dtype(config.kv_dtype, model.model.dtype, model.model.serves_packed))
    # Keyed as the engine keys its pages: by the model and its pool's dtype.
    seed = KeySeed(model_id=f"{config.model_id}/{pool_dtype}", tokenizer_hash=model.sha256)
    target, start = find_record(tmp_path, block_hashes(PROMPT, block_size=PAGE, seed=seed)[1])
    data = bytearray(target.read_bytes())
    if damage == "truncate":  # a torn write: page 1's record ends half way
        target.write_bytes(data[: start + 1000])
    else:
        data[start + 1000] ^= 0xFF  # inside the K bytes: only the checksum can tell
        target.write_bytes(bytes(data))

    restarted = make_tiny(kv_budget_tokens=POOL, kv_offload=True, kv_offload_dir=tmp_path)
    (again,) = run(restarted, [PROMPT], greedy(8))
    assert again.cached_tokens == PAGE  # page 0 loads; the chain stops at the damaged page 1
    assert again.token_ids == reference.token_ids


def test_loads_are_skipped_when_estimated_slower_than_recomputing(
    make_tiny: Callable[..., LocalEngine], reference: Generation
) -> None:
    # A speed-up no load can reach: once the memory tier's speed is measured, recomputing wins.
    engine = make_tiny(kv_budget_tokens=POOL, kv_offload=True, kv_offload_min_speedup=1e12)
    run(engine, [PROMPT], greedy(8))  # measures the prefill speed
    evict(engine, EVICTORS[:2])
    (measured,) = run(engine, [PROMPT], greedy(8))  # unmeasured tier: loads, and measures it
    evict(engine, EVICTORS[2:])
    (skipped,) = run(engine, [PROMPT], greedy(8))
    assert measured.cached_tokens == 3 * PAGE
    assert skipped.cached_tokens == 0
    assert skipped.token_ids == reference.token_ids
    stats = offload_stats(engine)
    assert stats.skipped_pages >= 1
    assert stats.prefill_tokens_per_s is not None and dict(stats.load_bytes_per_s)[L2_TIER] > 0


def test_flush_clears_offloaded_pages(make_tiny: Callable[..., LocalEngine], tmp_path: Path) -> None:
    engine = make_tiny(kv_budget_tokens=POOL, kv_offload=True, kv_offload_dir=tmp_path)
    run(engine, [PROMPT], greedy(4))
    evict(engine, EVICTORS[:2])
    assert all(t.entries for t in offload_stats(engine).store.tiers)
    run_flush(engine)
    assert [t.entries for t in offload_stats(engine).store.tiers] == [0, 0]
    (again,) = run(engine, [PROMPT], greedy(4))
    assert again.cached_tokens == 0


def run_flush(engine: LocalEngine) -> None:
    import asyncio

    assert asyncio.run(engine.flush_cache())
