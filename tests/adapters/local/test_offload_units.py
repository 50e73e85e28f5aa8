"""The offload's parts without a model: the page format and the load-or-recompute estimate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adapters.local.gguf_convert import ModelSpec
from adapters.local.kv_pool import KVPool
from adapters.local.offload import KVOffload
from adapters.local.offload_codec import PageCodec
from adapters.local.offload_cost import MIN_PREFILL_SAMPLE_TOKENS, LoadCostModel


def spec(layers: int = 2, kv_heads: int = 2, head_dim: int = 8) -> ModelSpec:
    return ModelSpec(
        num_layers=layers,
        hidden_size=kv_heads * head_dim * 2,
        intermediate_size=64,
        num_heads=kv_heads * 2,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=300,
        context_length=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tied_embeddings=True,
    )


def filled_pool(dtype: torch.dtype = torch.float32, page_size: int = 4, **shape: int) -> KVPool:
    pool = KVPool(spec(**shape), num_pages=4, page_size=page_size, dtype=dtype)
    pool.alloc(4)
    torch.manual_seed(0)
    pool.k.copy_(torch.randn(pool.k.shape))
    pool.v.copy_(torch.randn(pool.v.shape))
    return pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_page_round_trips_exactly(dtype: torch.dtype) -> None:
    pool = filled_pool(dtype)
    codec = PageCodec(pool)
    data = codec.encode(1)
    assert len(data) == codec.nbytes == 32 + pool.page_nbytes
    assert codec.decode_into(data, 3)
    assert torch.equal(pool.page_keys(3), pool.page_keys(1))
    assert torch.equal(pool.page_values(3), pool.page_values(1))
    assert b"".join(codec.parts(2)) == codec.encode(2)  # the shutdown flush's views of the pool


@pytest.mark.parametrize(
    "other",
    [
        {"dtype": torch.bfloat16},
        {"dtype": torch.float16},  # same bytes per page as bf16: the header's dtype tells them apart
        {"page_size": 8},
        {"layers": 3},
        {"kv_heads": 1, "head_dim": 16},  # same bytes per page, another layout
    ],
)
def test_a_page_of_another_layout_is_refused(other: dict[str, object]) -> None:
    source = filled_pool()
    target = filled_pool(**other)  # type: ignore[arg-type]
    before = target.k.clone()
    assert not PageCodec(target).decode_into(PageCodec(source).encode(0), 2)
    assert torch.equal(target.k, before)


def test_truncated_or_foreign_bytes_are_refused() -> None:
    pool = filled_pool()
    codec = PageCodec(pool)
    data = codec.encode(0)
    assert not codec.decode_into(data[:-1], 1)
    assert not codec.decode_into(b"RGC1" + data[4:], 1)


def test_loads_while_nothing_is_measured() -> None:
    model = LoadCostModel(min_speedup=1.0)
    assert model.worth_loading("kv_l3", 10**9, 16)
    model.observe_prefill(1000, 1.0)
    assert model.worth_loading("kv_l3", 10**9, 16)  # the tier itself is not measured yet


def test_a_tier_slower_than_recomputing_is_skipped() -> None:
    model = LoadCostModel(min_speedup=1.0)
    model.observe_prefill(1000, 1.0)  # 1,000 tokens/s: a 16-token page recomputes in 16 ms
    model.observe_load("kv_l2", 10**9, 1.0)  # 1 GB/s: a 1 MB page loads in 1 ms
    model.observe_load("kv_l3", 10**7, 1.0)  # 10 MB/s: 100 ms
    assert model.worth_loading("kv_l2", 10**6, 16)
    assert not model.worth_loading("kv_l3", 10**6, 16)


def test_min_speedup_demands_a_margin() -> None:
    model = LoadCostModel(min_speedup=20.0)
    model.observe_prefill(1000, 1.0)
    model.observe_load("kv_l2", 10**9, 1.0)
    assert not model.worth_loading("kv_l2", 10**6, 16)  # 16x faster, 20x demanded


def test_estimates_follow_new_measurements_and_ignore_tiny_steps() -> None:
    model = LoadCostModel(min_speedup=1.0)
    model.observe_prefill(MIN_PREFILL_SAMPLE_TOKENS - 1, 1.0)
    assert model.prefill.per_second is None
    model.observe_load("kv_l3", 10**9, 1.0)
    model.observe_prefill(1000, 1.0)
    assert model.worth_loading("kv_l3", 10**6, 16)
    for _ in range(20):  # the disk got slow
        model.observe_load("kv_l3", 10**6, 1.0)
    assert not model.worth_loading("kv_l3", 10**6, 16)


def offload(pool: KVPool, directory: Path) -> KVOffload:
    return KVOffload(
        pool,
        model_id="m",
        tokenizer_hash="t",
        memory_bytes=0,  # disk only: what a restart finds
        directory=directory,
        disk_bytes=1 << 24,
        min_speedup=1.0,
    )


def test_pages_of_another_layout_on_disk_are_misses_and_dropped(tmp_path: Path) -> None:
    tokens = list(range(100, 108))  # two 4-token pages
    writer = offload(filled_pool(layers=2), tmp_path)
    writer.save("", tokens, 0, [0, 1])
    writer.close()

    reader_pool = filled_pool(layers=3)  # same keys, another model shape behind them
    before = reader_pool.k.clone()
    reader = offload(reader_pool, tmp_path)
    planned = reader.plan("", tokens, start_page=0)
    assert len(planned) == 2 and reader.load(planned, [2, 3]) == 0
    assert torch.equal(reader_pool.k, before)
    stats = reader.stats()
    assert stats.rejected_pages == 1 and stats.store.misses == 1 and stats.store.hits == 0
    assert reader.plan("", tokens, start_page=0)[:1] == []  # the refused page is gone
    reader.close()
