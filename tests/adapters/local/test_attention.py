"""Attention over page runs (views, merged by log-sum-exp) against dense attention on gathered pages."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from adapters.local import attention
from adapters.local.attention import decode_attention, prefill_attention, prefix_attention_dtype
from adapters.local.attention_plan import (
    DecodePlan,
    GatheredRows,
    PageRun,
    PrefixPlan,
    ScatteredPages,
    SharedRun,
    page_runs,
    pool_rows,
    split_runs,
)

PAGE, KV_HEADS, HEADS, DIM = 4, 2, 6, 8


def pool(pages: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer of a pool, as `KVPool` lays it out: `[kv_heads, pages, page_size, d]`."""
    gen = torch.Generator().manual_seed(0)
    return (
        torch.randn(KV_HEADS, pages, PAGE, DIM, generator=gen),
        torch.randn(KV_HEADS, pages, PAGE, DIM, generator=gen),
    )


def by_token(layer: torch.Tensor) -> torch.Tensor:
    """`[pages, page_size, kv_heads, d]`: a pool layer indexed page first, for the references."""
    return layer.permute(1, 2, 0, 3)


def dense(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, pages: list[int], tokens: int
) -> torch.Tensor:
    """One query row over its context, gathered: `[heads * dim]`."""
    keys = by_token(k_pages)[pages].reshape(-1, KV_HEADS, DIM)[:tokens].transpose(0, 1)[None]
    values = by_token(v_pages)[pages].reshape(-1, KV_HEADS, DIM)[:tokens].transpose(0, 1)[None]
    out = F.scaled_dot_product_attention(q[None, :, None], keys, values, enable_gqa=True)
    return out.reshape(-1)


def _scattered(pages: list[int], tokens: int) -> ScatteredPages:
    """Pages of `pool()`'s layout copied together."""
    ids = torch.tensor(pages)
    return ScatteredPages(ids, tokens, pool_rows(ids, KV_HEADS, 32))


def test_page_runs_split_at_gaps_and_stop_at_the_context() -> None:
    assert page_runs([3, 4, 5, 9, 10], 18, PAGE) == [PageRun(3, 12), PageRun(9, 6)]
    assert page_runs([3, 4, 5, 9, 10], 12, PAGE) == [PageRun(3, 12)]
    assert page_runs([7], 1, PAGE) == [PageRun(7, 1)]


def test_split_runs_keeps_long_runs_and_pools_the_rest() -> None:
    pages = [*range(100, 120), 7, 9]
    long, rest, tokens = split_runs(pages, 20 * 16 + 20, 16)
    assert long == [PageRun(100, 320)] and rest == [7, 9] and tokens == 20


def test_decode_over_shared_and_own_runs_equals_dense() -> None:
    k_pages, v_pages = pool()
    tables = {0: ([1, 2, 3, 10], 15), 1: ([1, 2, 3, 20, 21], 18), 2: ([5, 6], 7)}
    plan = DecodePlan(
        count=3,
        runs=[
            SharedRun(PageRun(1, 12), torch.tensor([0, 1])),  # the prefix both first rows share
            SharedRun(PageRun(10, 3), torch.tensor([0])),
            SharedRun(PageRun(20, 6), torch.tensor([1])),
            SharedRun(PageRun(5, 7), torch.tensor([2])),
        ],
        gathered=None,
        merge=True,
    )
    q = torch.randn(3, HEADS, DIM)
    out = decode_attention(q, k_pages, v_pages, plan)
    for row, (pages, tokens) in tables.items():
        assert torch.allclose(out[row], dense(q[row], k_pages, v_pages, pages, tokens), atol=1e-5)


def test_prefill_chunk_over_prefix_runs_equals_masked_dense() -> None:
    k_pages, v_pages = pool()
    # 11 cached tokens: a run of two pages in place, then three tokens on a page copied.
    prefix = PrefixPlan(runs=[PageRun(2, 8)], scattered=_scattered([12], 3))
    n = 5
    q, k, v = torch.randn(n, HEADS, DIM), torch.randn(n, KV_HEADS, DIM), torch.randn(n, KV_HEADS, DIM)
    out = prefill_attention(q, k, v, k_pages, v_pages, prefix)
    k_tok, v_tok = by_token(k_pages), by_token(v_pages)
    cached_k = torch.cat([k_tok[2:4].reshape(-1, KV_HEADS, DIM), k_tok[12].reshape(-1, KV_HEADS, DIM)[:3]])
    cached_v = torch.cat([v_tok[2:4].reshape(-1, KV_HEADS, DIM), v_tok[12].reshape(-1, KV_HEADS, DIM)[:3]])
    keys = torch.cat([cached_k, k]).transpose(0, 1)[None]
    values = torch.cat([cached_v, v]).transpose(0, 1)[None]
    mask = torch.arange(11 + n)[None, :] <= torch.arange(11, 11 + n)[:, None]
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys, values, attn_mask=mask, enable_gqa=True
    )
    assert torch.allclose(out, expected[0].transpose(0, 1).reshape(n, -1), atol=1e-5)


@pytest.mark.parametrize("native_bf16", [True, False])
def test_a_float16_prefix_is_attended_in_bfloat16_where_the_cpu_multiplies_it(
    native_bf16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt chunk over a float16 pool's cached runs: in bfloat16 where that is native (close to
    the float32 answer, and not the float16 one), else in float16. Other pools are left as they are."""
    monkeypatch.setattr(attention, "native_bf16_matmul", lambda: native_bf16)
    assert prefix_attention_dtype(torch.float16) == (torch.bfloat16 if native_bf16 else torch.float16)
    assert prefix_attention_dtype(torch.bfloat16) == torch.bfloat16
    assert prefix_attention_dtype(torch.float32) == torch.float32
    k_pages, v_pages = (layer.half() for layer in pool())
    prefix = PrefixPlan(runs=[PageRun(2, 8)], scattered=_scattered([12], 3))
    q, k, v = torch.randn(5, HEADS, DIM), torch.randn(5, KV_HEADS, DIM), torch.randn(5, KV_HEADS, DIM)
    out = prefill_attention(q, k, v, k_pages, v_pages, prefix)
    exact = prefill_attention(q, k, v, k_pages.float(), v_pages.float(), prefix)
    assert out.dtype == torch.float32
    assert torch.allclose(out, exact, atol=3e-2)
    with monkeypatch.context() as patch:
        patch.setattr(attention, "native_bf16_matmul", lambda: not native_bf16)
        other = prefill_attention(q, k, v, k_pages, v_pages, prefix)
    assert not torch.equal(out, other)  # the two dtypes really differ


def test_gathered_short_contexts_equal_dense() -> None:
    k_pages, v_pages = pool()
    tables = {0: ([4, 9], 6), 1: ([11], 3), 2: ([2, 3, 7], 12)}
    widest = max(len(p) for p, _ in tables.values())
    padded = [p + [p[0]] * (widest - len(p)) for p, _ in tables.values()]
    visible = torch.arange(widest * PAGE)[None, :] < torch.tensor([t for _, t in tables.values()])[:, None]
    mask = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))[:, None, None, :]
    rows = pool_rows(torch.tensor(padded), KV_HEADS, 32)
    gathered = GatheredRows(rows=torch.tensor([0, 1, 2]), pool_rows=rows, mask=mask)
    q = torch.randn(3, HEADS, DIM)
    out = decode_attention(q, k_pages, v_pages, DecodePlan(count=3, runs=[], gathered=gathered, merge=False))
    for row, (pages, tokens) in tables.items():
        assert torch.allclose(out[row], dense(q[row], k_pages, v_pages, pages, tokens), atol=1e-5)


def test_pool_rows_copy_the_pages_of_every_head() -> None:
    """The copy a gathered block or scattered pages are attended from: the pages in the order given
    (repeats and all), head by head, as indexing the pool's page dimension would give."""
    k_pages, _ = pool()
    pages = torch.tensor([[7, 2, 30], [2, 2, 0]])
    copied = attention._copy_rows(k_pages, pool_rows(pages, KV_HEADS, k_pages.shape[1]))
    assert torch.equal(copied.view(KV_HEADS, 6, PAGE, DIM), k_pages[:, pages.view(-1)])
