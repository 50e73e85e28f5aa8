"""Plans for attention over the paged KV pool: where a row's context lives (runs of consecutive
pages, pages too short for a call of their own, padded blocks gathered for many rows) and how the
page tables are cut into them. `attention` carries the plans out."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True, frozen=True)
class PageRun:
    """`tokens` context tokens stored from slot `skip` of page `first_page` on, in consecutive pages."""

    first_page: int
    tokens: int
    skip: int = 0
    """Slots of the first page before the run (a sliding window's oldest page, partly hidden)."""


def pool_rows(pages: torch.Tensor, kv_heads: int, pool_pages: int) -> torch.Tensor:
    """Rows of one layer of the pool (`[kv_heads, pool_pages, page_size, d]`) seen as `[kv_heads *
    pool_pages, page_size * d]` that hold `pages` (page ids, flattened), head by head. `attention`
    copies pages with one `index_select` along these rows, which torch does row by row, instead of
    along the pool's page dimension, its generic path: 12.8 MiB of bfloat16 pages (16 rows of 2,176
    tokens) 1.7-3.2 ms against 2.8-5.1, from 64 pages on no slower, a few us slower below (AMD EPYC
    Zen 3, 2 threads, 2026-12-07, /tmp microbenchmark, medians of 30-300). Computed once per step."""
    heads = torch.arange(kv_heads, dtype=torch.long)[:, None] * pool_pages
    return (heads + pages.reshape(1, -1).to(torch.long)).view(-1)


@dataclass(slots=True)
class ScatteredPages:
    """Pages too short a run to be worth a call of their own: copied together, attended once."""

    pages: torch.Tensor
    tokens: int
    """Context tokens in them (all pages full but perhaps the last)."""
    pool_rows: torch.Tensor
    """`pool_rows(pages, ...)`: where the copy reads them."""


@dataclass(slots=True)
class PrefixPlan:
    """Where a prefill chunk's earlier context lives: long runs (views) and scattered pages."""

    runs: list[PageRun]
    scattered: ScatteredPages | None = None


@dataclass(slots=True)
class SharedRun:
    """One run of pages and the decode rows (batch rows) whose context includes it."""

    run: PageRun
    rows: torch.Tensor


@dataclass(slots=True)
class GatheredRows:
    """Per-row contexts copied into one padded block: one call instead of one per row. A block row
    holds one context and the queries of the decode rows that attend to it (a sequence's next
    token and its draft tokens, each seeing its own prefix of the context)."""

    rows: torch.Tensor
    """`[blocks]` (one query each), or `[blocks, queries]`: the decode rows of each block's
    queries, a short list padded with its first row (outputs dropped by `kept`)."""
    pool_rows: torch.Tensor
    """`pool_rows` of the blocks' page ids (`[blocks, max_pages]`, short rows padded with any valid
    page): where the copy reads them."""
    mask: torch.Tensor
    """`[blocks, 1, 1 or queries * groups, max_pages * page_size]` additive mask in the pool's
    dtype: 0 on the tokens a query sees, -inf on padding, on slots its runs skip and past its own
    position (a query's grouped heads are consecutive, as `decode_attention` folds them)."""
    kept: torch.Tensor | None = None
    """Positions in `rows.view(-1)` of the real queries, in ascending row order; None: all."""


@dataclass(slots=True)
class DecodePlan:
    """How the decode rows `0..count-1` of a batch attend: shared (and long) runs one call each,
    the rest of every row's context gathered into one padded call."""

    count: int
    runs: list[SharedRun]
    gathered: GatheredRows | None
    merge: bool
    """False when every row has exactly one part (its output needs no merging)."""
    segments: torch.Tensor | None = None
    """For the C kernel (`kernels.CpuKernels.decode_attention`), which replaces runs, gathering and
    merging when it runs: int32 `[S, 3]` (row, first token slot, tokens), each row's context as
    stretches of consecutive slots of at most `SEGMENT_TOKENS`."""


SEGMENT_TOKENS = 128
"""Longest stretch of a row's context the C decode attention takes as one unit of work: a 2,200-token
stream is 18 units handed to two threads (30 layers: 10.2 ms, against 14.5-16 ms for torch's flash
kernel in windows), and a unit's K/V stays in cache while each KV head reads it. Rows on one cached
prefix list the same stretches for it; the kernel attends each such stretch once for all of them."""


def segments(contexts: list[tuple[list[int], int]], page_size: int) -> torch.Tensor:
    """`DecodePlan.segments` for rows whose contexts are (page table, tokens)."""
    return run_segments([page_runs(pages, tokens, page_size) for pages, tokens in contexts], page_size)


def run_segments(contexts: list[list[PageRun]], page_size: int) -> torch.Tensor:
    """`DecodePlan.segments` for rows whose contexts are these runs of pages (a window's sinks and
    window, say)."""
    out: list[tuple[int, int, int]] = []
    for row, runs in enumerate(contexts):
        for run in runs:
            first = run.first_page * page_size + run.skip
            for start in range(0, run.tokens, SEGMENT_TOKENS):
                out.append((row, first + start, min(SEGMENT_TOKENS, run.tokens - start)))
    return torch.tensor(out, dtype=torch.int32)


VIEW_MIN_TOKENS = 256
"""A run at least this long is attended in place; shorter ones are copied and attended together.
A flash call costs ~0.1 ms on the dev box, about what copying 200 tokens of K/V per layer does."""


GATHER_MAX_BYTES = 32 << 20
"""Most bytes of K and V (one layer) a multi-row decode step copies into its padded block; rows
beyond it are read in place. One padded call over 16 rows' own contexts ran 2.3x faster than a call
per row at 256 tokens each and 1.5x at 2,048 (AVX2 code, float16 pool): a call per row leaves
threads idle (its 3 KV heads are 3 units of work), and the copy costs less than the calls. Again on
an AMD EPYC Zen 3 (bfloat16 pool, pages copied by `pool_rows`, 2026-12-07): a step of 16 rows at
2,176 tokens 421 against 473 ms, at 1,024 243 against 291, 8 rows at 2,176 a tie (230 ms)."""


def split_runs(pages: list[int], tokens: int, page_size: int) -> tuple[list[PageRun], list[int], int]:
    """The first `tokens` slots of a page table as long runs, plus the remaining pages (in order)
    and how many tokens they hold."""
    return split_run_list(page_runs(pages, tokens, page_size), page_size)


def split_run_list(runs: list[PageRun], page_size: int) -> tuple[list[PageRun], list[int], int]:
    """A context's runs as long runs, plus the pages of the short ones (in order) and how many
    tokens they hold. Only the context's last page may be partial among those pages, so a short
    partial run before the last (a window's sinks) stays a run of its own."""
    long: list[PageRun] = []
    rest: list[int] = []
    rest_tokens = 0
    for number, run in enumerate(runs):
        partial = run.tokens % page_size != 0 and number < len(runs) - 1
        if run.tokens >= VIEW_MIN_TOKENS or partial or run.skip:
            long.append(run)
        else:
            rest.extend(range(run.first_page, run.first_page + -(-run.tokens // page_size)))
            rest_tokens += run.tokens
    return long, rest, rest_tokens


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
