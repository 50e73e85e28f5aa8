"""Attention over the paged KV pool without copying pages: runs of consecutive pages are views.

A sequence's page table is a few runs of consecutive page ids (a cached prefix, then pages it
allocated itself). Attention over each run is a flash-attention call on a view of the pool; the
partial results are merged by their log-sum-exps, which is exact up to rounding. So nothing is
gathered or padded, and:

- decoding sequences that share a cached prefix read it once per step, as one call whose queries
  are all of theirs (cascade attention, as FlashInfer does on GPUs);
- a prefill chunk attends over its prefix runs (everything visible) and over itself (causal),
  never computing the scores a bottom-right mask would throw away.

Queries of the `groups` heads that share a KV head are folded into one block, so grouped-query
attention needs no copy of the keys either. The flash kernel that returns the log-sum-exp is a
private op, stable since torch 2.2 (torch is pinned).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True, frozen=True)
class PageRun:
    """`tokens` context tokens stored from the start of page `first_page` on, in consecutive pages."""

    first_page: int
    tokens: int


@dataclass(slots=True)
class SharedRun:
    """One run of pages and the decode rows (batch rows) whose context includes it."""

    run: PageRun
    rows: torch.Tensor


@dataclass(slots=True)
class DecodePlan:
    """How the decode rows `0..count-1` of a batch attend: one call per distinct run."""

    count: int
    runs: list[SharedRun]
    merge: bool
    """False when every row has exactly one run (its output needs no merging)."""


def page_runs(pages: list[int], tokens: int, page_size: int) -> list[PageRun]:
    """Split the first `tokens` slots of a page table into runs of consecutive page ids."""
    runs: list[PageRun] = []
    held = -(-tokens // page_size)
    start = 0
    for i in range(1, held + 1):
        if i == held or pages[i] != pages[i - 1] + 1:
            end_tokens = min(i * page_size, tokens)
            runs.append(PageRun(first_page=pages[start], tokens=end_tokens - start * page_size))
            start = i
    return runs


def decode_attention(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, plan: DecodePlan
) -> torch.Tensor:
    """`[count, heads * head_dim]` attention outputs of the decode rows `q` (`[count, heads, head_dim]`)."""
    count, heads, dim = q.shape
    parts = []
    for shared in plan.runs:
        rows = shared.rows
        o, lse = _run_attention(q.index_select(0, rows), k_pages, v_pages, shared.run)
        parts.append((rows, o, lse))
    if not plan.merge:
        out = torch.empty(count, heads, dim, dtype=q.dtype)
        for rows, o, _ in parts:
            out.index_copy_(0, rows, o)
        return out.view(count, heads * dim)
    return _merge(count, parts).view(count, heads * dim)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    prefix: list[PageRun],
) -> torch.Tensor:
    """`[n, heads * head_dim]` for a chunk of `n` new tokens (`q` `[n, heads, d]`, `k`/`v`
    `[n, kv_heads, d]`) over its cached prefix runs and, causally, itself."""
    n, heads, dim = q.shape
    query = q.transpose(0, 1).unsqueeze(0)
    if not prefix:
        keys, values = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(query, keys, values, is_causal=True, enable_gqa=True)
        return o.squeeze(0).transpose(0, 1).reshape(n, heads * dim)
    groups = heads // k.shape[1]
    keys = k.repeat_interleave(groups, dim=1).transpose(0, 1).unsqueeze(0)
    values = v.repeat_interleave(groups, dim=1).transpose(0, 1).unsqueeze(0)
    o, lse = _flash_with_lse(query, keys, values, causal=True)
    rows = torch.arange(n)
    parts = [(rows, o.squeeze(0).transpose(0, 1), lse.squeeze(0).transpose(0, 1))]
    for run in prefix:
        parts.append((rows, *_run_attention(q, k_pages, v_pages, run)))
    return _merge(n, parts).view(n, heads * dim)


def _run_attention(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, run: PageRun
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `q` (`[r, heads, d]`) over one page run, all of it visible: (`[r, heads, d]`, `[r, heads]`)."""
    r, heads, dim = q.shape
    page_size, kv_heads = k_pages.shape[1], k_pages.shape[2]
    groups = heads // kv_heads
    pages = slice(run.first_page, run.first_page + -(-run.tokens // page_size))
    keys = k_pages[pages].view(-1, kv_heads, dim)[: run.tokens].transpose(0, 1).unsqueeze(0)
    values = v_pages[pages].view(-1, kv_heads, dim)[: run.tokens].transpose(0, 1).unsqueeze(0)
    folded = q.view(r, kv_heads, groups, dim).transpose(0, 1).reshape(1, kv_heads, r * groups, dim)
    o, lse = _flash_with_lse(folded, keys, values, causal=False)
    o = o.view(kv_heads, r, groups, dim).transpose(0, 1).reshape(r, heads, dim)
    return o, lse.view(kv_heads, r, groups).transpose(0, 1).reshape(r, heads)


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
    merged = torch.zeros(count, heads, outs.shape[2], dtype=outs.dtype).index_add_(
        0, rows, outs * weights[..., None]
    )
    return (merged / total[..., None]).to(outs.dtype)


def _flash_with_lse(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, keys, values, 0.0, causal)[
        :2
    ]
    return out, lse
