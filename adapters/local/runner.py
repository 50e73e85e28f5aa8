"""Turn a scheduled step into one packed forward batch, run it, and say whose logits are whose.

Rows are packed decode-first: one row per decoding sequence (plus one per draft token it
verifies, each a decode row of its own whose context ends at its own position: the K/V of the
whole row group is written before anyone attends), then each prefill chunk's tokens. Decode rows
and chunks that finish their prompt ask for logits. The runner also plans
attention from the page tables (see `attention`): which runs of pages are shared by several
decoding sequences (read once), what each sequence has on its own (copied into one padded block,
its rows the queries of its block row), and what is read in place (a lone row's long runs).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from adapters.local.attention_plan import (
    GATHER_MAX_BYTES,
    VIEW_MIN_TOKENS,
    DecodePlan,
    GatheredRows,
    PageRun,
    PrefixPlan,
    ScatteredPages,
    SharedRun,
    page_runs,
    pool_rows,
    run_segments,
    split_run_list,
)
from adapters.local.forward_batch import ForwardBatch, PrefillSegment
from adapters.local.kv_pool import KVPool
from adapters.local.linear import EXACT_PROMPT_TOKENS
from adapters.local.model import LlamaModel
from adapters.local.scheduler import ScheduledStep
from adapters.local.sequence import Sequence


@dataclass(slots=True)
class StepOutput:
    """Logits for the sequences that sample this step, in order: `1 + len(seq.draft)` rows each,
    from `first_rows[i]` on."""

    sampled: list[Sequence]
    logits: torch.Tensor
    first_rows: list[int]


class ModelRunner:
    """Owns the model and the pool tensors; everything else is page ids."""

    def __init__(self, model: LlamaModel, pool: KVPool) -> None:
        self.model = model
        self.pool = pool
        self.page_size = pool.page_size

    @torch.inference_mode()
    def run(self, step: ScheduledStep) -> StepOutput:
        """Compute the step's tokens, write their K/V, advance `num_computed` (drafts not counted:
        their K/V counts once accepted), return logits."""
        for move in step.rotations:  # a window slid: its keys move
            self.model.shift_keys(self.pool, move.slots, move.shift, move.sources)
        batch, sampled, first_rows = self._build(step)
        logits = self.model.forward(batch, self.pool)
        for seq in step.decodes:
            seq.num_computed += 1
        for seq, chunk in step.prefills:
            seq.num_computed += chunk
        return StepOutput(sampled=sampled, logits=logits, first_rows=first_rows)

    def _build(self, step: ScheduledStep) -> tuple[ForwardBatch, list[Sequence], list[int]]:
        ps = self.page_size
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        rows: list[int] = []
        sampled: list[Sequence] = []
        first_rows: list[int] = []
        contexts: list[list[PageRun]] = []  # the page runs each decode row attends to
        sizes: list[int] = []  # decode rows of each decoding sequence, in order

        def place(seq: Sequence, pos: int, token: int) -> None:
            tokens.append(token)
            window = seq.window
            if window is None:
                positions.append(pos)
                slots.append(seq.pages[pos // ps] * ps + pos % ps)
            else:
                positions.append(window.position(pos))
                slots.append(seq.pages[window.page_index(pos)] * ps + pos % ps)

        def add(seq: Sequence, start: int, count: int) -> None:
            for pos in range(start, start + count):
                place(seq, pos, seq.tokens[pos])

        for seq in step.decodes:
            first_rows.append(len(rows))
            sampled.append(seq)
            start = seq.num_computed
            sizes.append(1 + len(seq.draft))
            # A sequence's draft tokens are verified as rows after its last one (a windowed
            # sequence has none: `EngineCore._enqueue`).
            for offset, token in enumerate([seq.tokens[start], *seq.draft]):
                rows.append(len(tokens))
                place(seq, start + offset, token)
                contexts.append(self._context(seq, start + offset + 1))
        prefills = []
        for seq, chunk in step.prefills:
            start = len(tokens)
            prefix = self._prefix_plan(self._context(seq, seq.num_computed)) if seq.num_computed else None
            add(seq, seq.num_computed, chunk)
            int8 = seq.prompt_len > EXACT_PROMPT_TOKENS
            prefills.append(PrefillSegment(start=start, length=chunk, prefix=prefix, int8=int8))
            if seq.num_computed + chunk == len(seq.tokens):
                first_rows.append(len(rows))
                rows.append(len(tokens) - 1)
                sampled.append(seq)
        batch = ForwardBatch(
            token_ids=torch.tensor(tokens, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            slots=torch.tensor(slots, dtype=torch.long),
            logit_rows=torch.tensor(rows, dtype=torch.long),
            decode=self._decode_plan(contexts, sizes) if contexts else None,
            prefills=prefills,
        )
        return batch, sampled, first_rows

    def _context(self, seq: Sequence, tokens: int) -> list[PageRun]:
        """The runs of pages the first `tokens` tokens of `seq` attend to (a window's sinks and
        window when it has one)."""
        if seq.window is not None:
            return seq.window.visible_runs(seq.pages, tokens)
        return page_runs(seq.pages, tokens, self.page_size)

    def _prefix_plan(self, context: list[PageRun]) -> PrefixPlan:
        runs, rest, rest_tokens = split_run_list(context, self.page_size)
        scattered = None
        if rest:
            pages = torch.tensor(rest, dtype=torch.long)
            scattered = ScatteredPages(pages, rest_tokens, self._pool_rows(pages))
        return PrefixPlan(runs=runs, scattered=scattered)

    def _decode_plan(self, contexts: list[list[PageRun]], sizes: list[int] | None = None) -> DecodePlan:
        """Decode rows with their contexts (page runs); `sizes`: rows of each sequence, in order
        (None: one each). A prefix several sequences share from the cache becomes one run that all
        their rows attend to in a single call; in a step of several rows, each sequence's own
        context goes into one padded call as one block whose queries are its rows (its next token
        and its drafts), up to `GATHER_MAX_BYTES`. A lone row, and sequences past that budget,
        read their long runs in place (a sequence's rows share one call for their common pages)."""
        ps = self.page_size
        if self.model.kernel_attends(self.pool):
            return DecodePlan(
                count=len(contexts), runs=[], gathered=None, merge=False, segments=run_segments(contexts, ps)
            )
        groups: list[list[int]] = []  # each sequence's rows
        for size in sizes or [1] * len(contexts):
            first = sum(len(g) for g in groups)
            groups.append(list(range(first, first + size)))
        seq_of = [number for number, rows in enumerate(groups) for _ in rows]
        by_start: dict[int, list[int]] = defaultdict(list)
        for i, context in enumerate(contexts):
            by_start[context[0].first_page].append(i)
        skip = [0] * len(contexts)  # tokens each row reads through a shared run
        runs: list[SharedRun] = []
        own_only: dict[int, tuple[PageRun, list[int]]] = {}  # one sequence's common pages, by sequence
        for start, members in by_start.items():
            # The whole pages every member holds from this first page on are read once for all.
            common = min(contexts[i][0].tokens for i in members) // ps * ps
            if len(members) < 2 or common == 0:
                continue
            if len({seq_of[i] for i in members}) > 1:
                runs.append(SharedRun(PageRun(start, common), torch.tensor(members)))
                for i in members:
                    skip[i] = common
            else:
                own_only[seq_of[members[0]]] = (PageRun(start, common), members)
        # Each sequence's own context: its last row's (the widest), past the pages read shared.
        own = [_drop_front(contexts[g[-1]], skip[g[-1]], ps) for g in groups]
        chosen = self._gathered_seqs(own) if len(contexts) > 1 else set()
        parts = [int(t > 0) for t in skip]
        blocks: list[tuple[list[int], list[PageRun], list[int]]] = []  # (rows, runs, tokens each row sees)
        for number, rows in enumerate(groups):
            if number in chosen:
                seen = [sum(run.tokens for run in _drop_front(contexts[i], skip[i], ps)) for i in rows]
                # A row whose context ends where the shared run does reads nothing more.
                queried = [(i, tokens) for i, tokens in zip(rows, seen, strict=True) if tokens]
                blocks.append(([i for i, _ in queried], own[number], [t for _, t in queried]))
                for i, _ in queried:
                    parts[i] += 1
                continue
            if number in own_only:  # past the budget: the sequence's rows share its common pages
                run, members = own_only[number]
                runs.append(SharedRun(run, torch.tensor(members)))
                for i in members:
                    skip[i], parts[i] = run.tokens, parts[i] + 1
            for i in rows:  # long runs in place, one call each; the short rest joins the padded block
                row_runs = _drop_front(contexts[i], skip[i], ps)
                long = [run for run in row_runs if run.tokens >= VIEW_MIN_TOKENS]
                runs.extend(SharedRun(run, torch.tensor([i])) for run in long)
                short = [run for run in row_runs if run.tokens < VIEW_MIN_TOKENS]
                parts[i] += len(long) + bool(short)
                if short:
                    blocks.append(([i], short, [sum(run.tokens for run in short)]))
        block = self._gather(sorted(blocks, key=lambda b: b[0][0])) if blocks else None
        return DecodePlan(count=len(contexts), runs=runs, gathered=block, merge=max(parts) > 1)

    def _pool_rows(self, pages: torch.Tensor) -> torch.Tensor:
        """`attention_plan.pool_rows` of `pages` in this runner's pool."""
        return pool_rows(pages, self.pool.k.shape[1], self.pool.k.shape[2])

    def _gathered_seqs(self, own: list[list[PageRun]]) -> set[int]:
        """The sequences whose own context (`own`, by sequence) goes into the padded block: the
        shortest first, while the block's K and V stay within `GATHER_MAX_BYTES`."""
        ps = self.page_size
        kv_heads, dim = self.pool.k.shape[1], self.pool.k.shape[4]
        token_bytes = 2 * kv_heads * dim * self.pool.k.element_size()  # K and V of one slot, one layer
        pages = sorted((sum(_pages(run, ps) for run in runs), i) for i, runs in enumerate(own) if runs)
        chosen: set[int] = set()
        for count, (widest, i) in enumerate(pages, start=1):
            if count * widest * ps * token_bytes > GATHER_MAX_BYTES:
                break
            chosen.add(i)
        return chosen

    def _gather(self, blocks: list[tuple[list[int], list[PageRun], list[int]]]) -> GatheredRows:
        """Blocks (rows, runs, tokens each row sees) copied into one padded block: the runs'
        pages, and a mask showing each query only its tokens (a window's oldest page is partly
        hidden, its sinks' page partly filled; a draft row sees up to its own position)."""
        ps = self.page_size
        tables = [_run_pages(runs, ps) for _, runs, _ in blocks]
        widest = max(len(table) for table in tables)
        visible = torch.zeros(len(blocks), widest * ps, dtype=torch.bool)
        for number, (_, runs, _) in enumerate(blocks):
            offset = 0
            for run in runs:
                visible[number, offset + run.skip : offset + run.skip + run.tokens] = True
                offset += _pages(run, ps) * ps
        queries = max(len(rows) for rows, _, _ in blocks)
        padded = [table + [table[0]] * (widest - len(table)) for table in tables]
        pages = torch.tensor(padded, dtype=torch.long)
        dtype = self.pool.k.dtype
        if queries == 1:
            mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))
            return GatheredRows(
                rows=torch.tensor([rows[0] for rows, _, _ in blocks]),
                pool_rows=self._pool_rows(pages),
                mask=mask[:, None, None, :],
            )
        seen = torch.tensor([tokens + tokens[:1] * (queries - len(tokens)) for _, _, tokens in blocks])
        shown = visible[:, None, :] & (visible.cumsum(-1)[:, None, :] <= seen[:, :, None])
        spec = self.model.spec
        mask = torch.zeros(shown.shape, dtype=dtype).masked_fill_(~shown, float("-inf"))
        mask = mask.repeat_interleave(spec.num_heads // spec.num_kv_heads, dim=1)
        table = [rows + rows[:1] * (queries - len(rows)) for rows, _, _ in blocks]
        kept = [b * queries + k for b, (rows, _, _) in enumerate(blocks) for k in range(len(rows))]
        return GatheredRows(
            rows=torch.tensor(table),
            pool_rows=self._pool_rows(pages),
            mask=mask[:, None],
            kept=torch.tensor(kept),
        )


def _run_pages(runs: list[PageRun], page_size: int) -> list[int]:
    """The page ids `runs` span, in order."""
    return [page for run in runs for page in range(run.first_page, run.first_page + _pages(run, page_size))]


def _pages(run: PageRun, page_size: int) -> int:
    """Pages `run` spans (its first page's hidden slots included)."""
    return -(-(run.skip + run.tokens) // page_size)


def _drop_front(runs: list[PageRun], tokens: int, page_size: int) -> list[PageRun]:
    """`runs` without their first `tokens` tokens: whole pages of the first run, read by a shared run."""
    if tokens == 0:
        return runs
    first = runs[0]
    if first.tokens <= tokens:
        return runs[1:]
    return [PageRun(first.first_page + tokens // page_size, first.tokens - tokens), *runs[1:]]
