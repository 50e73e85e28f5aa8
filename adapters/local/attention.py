"""Attention over the paged KV pool: runs of consecutive pages are views, short ones are copied.

A sequence's page table is a few runs of consecutive page ids (a cached prefix, then pages it
allocated itself). Attention over each run is a flash-attention call on a view of the pool; the
partial results are merged by their log-sum-exps, which is exact up to rounding. So:

- decoding sequences that share a cached prefix read it once per step, as one call whose queries
  are all of theirs (cascade attention, as FlashInfer does on GPUs); what each sequence of a
  multi-row step has on its own is copied into one padded, masked block for a single call, its
  draft rows as queries of its block row (`attention_plan.GATHER_MAX_BYTES`: a call per row costs
  more than the copy); a lone row's long runs stay views;
- a prefill chunk attends over its prefix (everything visible: long runs in place, short ones
  copied into one block) and over itself (causal), never computing the scores a bottom-right
  mask would throw away.

Queries of the `groups` heads that share a KV head are folded into one block, so grouped-query
attention needs no copy of the keys either. The flash kernel that returns the log-sum-exp is a
private op, stable since torch 2.2 (torch is pinned). The plans these functions carry out (which
runs, which pages gathered) are `attention_plan`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from adapters.local.attention_plan import (
    DecodePlan,
    GatheredRows,
    PageRun,
    PrefixPlan,
    ScatteredPages,
)
from adapters.local.matmul_attention import native_bf16_matmul


def decode_attention(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, plan: DecodePlan
) -> torch.Tensor:
    """`[count, heads * head_dim]` attention outputs of the decode rows `q` (`[count, heads, head_dim]`)."""
    count, heads, dim = q.shape
    if not plan.merge and plan.gathered is None and len(plan.runs) == 1:
        # One run read by every row (a single stream, or streams on one shared prefix): no
        # selecting, scattering or merging; rows of a run are in ascending order.
        o, _ = _run_attention(q, k_pages, v_pages, plan.runs[0].run)
        return o.reshape(count, heads * dim)
    gathered = _gathered_attention(q, k_pages, v_pages, plan.gathered) if plan.gathered else None
    if not plan.merge and not plan.runs and gathered is not None and len(gathered[0]) == count:
        # Every row in the padded block, in ascending order (as the runner builds it): as is.
        return gathered[1].reshape(count, heads * dim)
    parts = []
    for shared in plan.runs:
        rows = shared.rows
        o, lse = _run_attention(q.index_select(0, rows), k_pages, v_pages, shared.run)
        parts.append((rows, o, lse))
    if gathered is not None:
        parts.append(gathered)
    if not plan.merge:
        out = torch.empty(count, heads, dim, dtype=q.dtype)
        for rows, o, _ in parts:
            out.index_copy_(0, rows, o)
        return out.view(count, heads * dim)
    return _merge(count, parts).view(count, heads * dim)


@dataclass(slots=True)
class RunWindows:
    """One page run, in every layer, cut into `count` equal windows along the tokens: views of the
    pool shaped `[layers, count, kv_heads, window, d]`. A window starts `stride` tokens after the
    previous one; when `count` does not divide the run, consecutive windows overlap by a few
    tokens, which `mask` hides from all but one window."""

    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor | None
    """`[count, 1, 1, window]` additive: -inf on the tokens an earlier window already covers."""


def run_windows(k: torch.Tensor, v: torch.Tensor, run: PageRun, count: int) -> RunWindows:
    """Window views of `run` in every layer of the pool (`k`, `v`: `[layers, kv_heads, pages,
    page_size, d]`); `count` must not exceed the run's tokens."""
    layers, kv_heads, _, page_size, dim = k.shape
    stride = run.tokens // count
    window = run.tokens - (count - 1) * stride
    size = (layers, count, kv_heads, window, dim)
    strides = (k.stride(0), stride * dim, k.stride(1), dim, 1)
    offset = k.storage_offset() + (run.first_page * page_size + run.skip) * dim
    mask = None
    if window > stride:
        mask = torch.zeros(count, 1, 1, window, dtype=k.dtype)
        mask[1:, ..., : window - stride] = float("-inf")
    return RunWindows(
        keys=k.as_strided(size, strides, offset), values=v.as_strided(size, strides, offset), mask=mask
    )


def windowed_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """`[r, heads * d]`: rows `q` (`[r, heads, d]`) over one run, all of it visible, given one
    layer's `RunWindows` views (`[count, kv_heads, window, d]`). One flash call attends every
    window; the windows' results are merged by their log-sum-exps (a softmax over windows).

    Why windows: the flash kernel hands each (batch, head) to one thread, and a few decode rows
    over one run with grouped queries folded are only `kv_heads` (3) units of work; on two
    threads one would do two of them. `count` windows make `count * kv_heads` shorter units."""
    r, heads, dim = q.shape
    count, kv_heads = keys.shape[0], keys.shape[1]
    groups = heads // kv_heads
    folded = q.reshape(r, kv_heads, groups, dim).transpose(0, 1).reshape(1, kv_heads, r * groups, dim)
    o, lse = _flash_with_lse(folded.expand(count, -1, -1, -1), keys, values, causal=False, mask=mask)
    merged = torch.mul(o, torch.softmax(lse, dim=0).unsqueeze(-1).to(o.dtype)).sum(0)
    return merged.view(kv_heads, r, groups, dim).transpose(0, 1).reshape(r, heads * dim)


def prefix_attention_dtype(pool: torch.dtype) -> torch.dtype:
    """The dtype a prompt chunk attends its cached prefix in: bfloat16 for a float16 pool where the
    CPU multiplies bfloat16 natively (`native_bf16_matmul`), else the pool's. On an Intel Xeon with
    AVX512-FP16 and AMX (where the pool is float16 for decode's sake, `kv_pool.half_kv_dtype`) the
    flash kernel over the converted runs took 45-51 ms for 30 layers of 128 rows over 2,048 cached
    tokens against 84-87 in float16, 92 against 230 at 512 rows over 1,536 (2026-12-03,
    `benchmarks/results/engine_quantized.md`). Prompt rows only: decode keeps the pool's precision."""
    if pool == torch.float16 and native_bf16_matmul():
        return torch.bfloat16
    return pool


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    prefix: PrefixPlan | None,
) -> torch.Tensor:
    """`[n, heads * head_dim]` for a chunk of `n` new tokens (`q` `[n, heads, d]`, `k`/`v`
    `[n, kv_heads, d]`) over its cached prefix runs and, causally, itself."""
    n, heads, dim = q.shape
    query = q.transpose(0, 1).unsqueeze(0)
    if prefix is None:
        keys, values = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(query, keys, values, is_causal=True, enable_gqa=True)
        return o.squeeze(0).transpose(0, 1).reshape(n, heads * dim)
    # The flash kernel maps query heads to their KV head itself: no repeated copy of K and V.
    keys, values = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    o, lse = _flash_with_lse(query, keys, values, causal=True)
    parts = [(o.squeeze(0).transpose(0, 1), lse.squeeze(0).transpose(0, 1))]
    attend = prefix_attention_dtype(k_pages.dtype)
    for run in prefix.runs:
        parts.append(_run_attention(q, k_pages, v_pages, run, attend))
    if prefix.scattered is not None:
        parts.append(_scattered_attention(q, k_pages, v_pages, prefix.scattered, attend))
    return _merge_all_rows(parts).view(n, heads * dim)


def context_slots(prefix: PrefixPlan | None, chunk_slots: torch.Tensor, page_size: int) -> torch.Tensor:
    """int32 token slots of a prefill chunk's whole context for the C kernel
    (`kernels.CpuKernels.prefill_attention`): the prefix (every token visible, so in any order),
    then the chunk's own slots in order."""
    parts = []
    if prefix is not None:
        for run in prefix.runs:
            first = run.first_page * page_size + run.skip
            parts.append(torch.arange(first, first + run.tokens, dtype=torch.int64))
        if prefix.scattered is not None:
            offsets = torch.arange(page_size, dtype=torch.int64)
            slots = (prefix.scattered.pages.to(torch.int64)[:, None] * page_size + offsets).view(-1)
            parts.append(slots[: prefix.scattered.tokens])
    parts.append(chunk_slots.to(torch.int64))
    return torch.cat(parts).to(torch.int32)


def _run_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    run: PageRun,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `q` (`[r, heads, d]`) over one page run, all of it visible: (`[r, heads, d]`, `[r, heads]`).
    `dtype`: attend a copy of the run's keys and values in it (default: the pool's, no copy)."""
    r, heads, dim = q.shape
    kv_heads, _, page_size = k_pages.shape[:3]
    groups = heads // kv_heads
    first = run.first_page * page_size + run.skip
    slots = slice(first, first + run.tokens)
    keys = k_pages.view(kv_heads, -1, dim)[:, slots].unsqueeze(0).to(dtype or k_pages.dtype)
    values = v_pages.view(kv_heads, -1, dim)[:, slots].unsqueeze(0).to(dtype or v_pages.dtype)
    folded = q.view(r, kv_heads, groups, dim).transpose(0, 1).reshape(1, kv_heads, r * groups, dim)
    o, lse = _flash_with_lse(folded, keys, values, causal=False)
    o = o.view(kv_heads, r, groups, dim).transpose(0, 1).reshape(r, heads, dim)
    return o, lse.view(kv_heads, r, groups).transpose(0, 1).reshape(r, heads)


def _scattered_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    scattered: ScatteredPages,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `q` over scattered pages copied into one block (in `dtype`, default the pool's), all
    visible."""
    r, heads, dim = q.shape
    kv_heads = k_pages.shape[0]
    groups = heads // kv_heads
    keys = _copy_rows(k_pages, scattered.pool_rows).view(1, kv_heads, -1, dim)[:, :, : scattered.tokens]
    values = _copy_rows(v_pages, scattered.pool_rows).view(1, kv_heads, -1, dim)[:, :, : scattered.tokens]
    keys, values = keys.to(dtype or keys.dtype), values.to(dtype or values.dtype)
    folded = q.view(r, kv_heads, groups, dim).transpose(0, 1).reshape(1, kv_heads, r * groups, dim)
    o, lse = _flash_with_lse(folded, keys, values, causal=False)
    o = o.view(kv_heads, r, groups, dim).transpose(0, 1).reshape(r, heads, dim)
    return o, lse.view(kv_heads, r, groups).transpose(0, 1).reshape(r, heads)


def _gathered_attention(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, gathered: GatheredRows
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block's queries (decode rows of `q`, `[count, heads, d]`) over their padded contexts:
    (rows, `[rows, heads, d]`, `[rows, heads]`)."""
    heads, dim = q.shape[1:]
    kv_heads = k_pages.shape[0]
    groups = heads // kv_heads
    table = gathered.rows if gathered.rows.dim() == 2 else gathered.rows[:, None]
    blocks, queries = table.shape
    keys = _copy_rows(k_pages, gathered.pool_rows).view(kv_heads, blocks, -1, dim).transpose(0, 1)
    values = _copy_rows(v_pages, gathered.pool_rows).view(kv_heads, blocks, -1, dim).transpose(0, 1)
    folded = q.index_select(0, table.view(-1)).view(blocks, queries, kv_heads, groups, dim)
    folded = folded.transpose(1, 2).reshape(blocks, kv_heads, queries * groups, dim)
    o, lse = _flash_with_lse(folded, keys, values, causal=False, mask=gathered.mask)
    o = o.view(blocks, kv_heads, queries, groups, dim).transpose(1, 2).reshape(-1, heads, dim)
    lse = lse.view(blocks, kv_heads, queries, groups).transpose(1, 2).reshape(-1, heads)
    rows = table.view(-1)
    if gathered.kept is not None:
        rows, o, lse = rows[gathered.kept], o[gathered.kept], lse[gathered.kept]
    return rows, o, lse


def _copy_rows(layer: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` (`attention_plan.pool_rows`) of one layer of the pool, `[kv_heads, pages,
    page_size, d]`, copied: `[len(rows), page_size * d]`."""
    return layer.view(layer.shape[0] * layer.shape[1], -1).index_select(0, rows)


def _merge(count: int, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Combine partial attentions (each part: rows, outputs, log-sum-exps) into `[count, heads, d]`."""
    rows = torch.cat([p[0] for p in parts])
    outs = torch.cat([p[1] for p in parts])
    lses = torch.cat([p[2] for p in parts])
    heads = lses.shape[1]
    peak = torch.full((count, heads), float("-inf"), dtype=lses.dtype)
    peak = peak.scatter_reduce(0, rows[:, None].expand(-1, heads), lses, reduce="amax")
    weights = (lses - peak.index_select(0, rows)).exp()
    total = torch.zeros(count, heads, dtype=lses.dtype).index_add_(0, rows, weights)
    # Accumulated in the log-sum-exps' fp32 (a bf16 pool's outputs are upcast), cast back at the end.
    merged = torch.zeros(count, heads, outs.shape[2], dtype=lses.dtype).index_add_(
        0, rows, outs.to(lses.dtype) * weights[..., None]
    )
    return (merged / total[..., None]).to(outs.dtype)


def _merge_all_rows(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Combine partial attentions that all cover the same rows (outputs `[n, heads, d]`, log-sum-exps
    `[n, heads]`), accumulating in place: a long chunk's merge allocates one output, no concatenation."""
    peak = parts[0][1].clone()
    for _, lse in parts[1:]:
        torch.maximum(peak, lse, out=peak)
    total = torch.zeros_like(peak)
    merged = torch.zeros(parts[0][0].shape, dtype=parts[0][0].dtype)
    for o, lse in parts:
        weight = (lse - peak).exp_()
        total.add_(weight)
        merged.addcmul_(o, weight.unsqueeze(-1).to(o.dtype))
    return merged.div_(total.unsqueeze(-1).to(merged.dtype))


def _flash_with_lse(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    causal: bool,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash attention in the keys' dtype (a half pool's: the kernel takes one dtype and accumulates
    in fp32), its output back in the query's."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    kv = keys.dtype
    mask = mask.to(kv) if mask is not None else None
    out, lse = flash(query.to(kv), keys, values, 0.0, causal, attn_mask=mask)[:2]
    return out.to(query.dtype), lse
