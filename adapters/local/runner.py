"""Turn a scheduled step into one packed forward batch, run it, and say whose logits are whose.

Rows are packed decode-first: one row per decoding sequence, then each prefill chunk's tokens.
Only decoding sequences and chunks that finish their prompt ask for logits.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from adapters.local.attention import DecodePlan, PageRun, SharedRun, page_runs
from adapters.local.kv_pool import KVPool
from adapters.local.model import ForwardBatch, LlamaModel, PrefillSegment
from adapters.local.scheduler import ScheduledStep
from adapters.local.sequence import Sequence


@dataclass(slots=True)
class StepOutput:
    """Logits `[len(sampled), vocab]` for the sequences that sample this step, in order."""

    sampled: list[Sequence]
    logits: torch.Tensor


class ModelRunner:
    """Owns the model and the pool tensors; everything else is page ids."""

    def __init__(self, model: LlamaModel, pool: KVPool) -> None:
        self.model = model
        self.pool = pool
        self.page_size = pool.page_size

    @torch.inference_mode()
    def run(self, step: ScheduledStep) -> StepOutput:
        """Compute the step's tokens, write their K/V, advance `num_computed`, return logits."""
        batch, sampled = self._build(step)
        logits = self.model.forward(batch, self.pool)
        for seq in step.decodes:
            seq.num_computed += 1
        for seq, chunk in step.prefills:
            seq.num_computed += chunk
        return StepOutput(sampled=sampled, logits=logits)

    def _build(self, step: ScheduledStep) -> tuple[ForwardBatch, list[Sequence]]:
        ps = self.page_size
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        rows: list[int] = []
        sampled: list[Sequence] = []

        def add(seq: Sequence, start: int, count: int) -> None:
            for pos in range(start, start + count):
                tokens.append(seq.tokens[pos])
                positions.append(pos)
                slots.append(seq.pages[pos // ps] * ps + pos % ps)

        for seq in step.decodes:
            rows.append(len(tokens))
            sampled.append(seq)
            add(seq, seq.num_computed, 1)
        prefills = []
        for seq, chunk in step.prefills:
            start = len(tokens)
            prefix = page_runs(seq.pages, seq.num_computed, ps) if seq.num_computed else []
            add(seq, seq.num_computed, chunk)
            prefills.append(PrefillSegment(start=start, length=chunk, prefix=prefix))
            if seq.num_computed + chunk == len(seq.tokens):
                rows.append(len(tokens) - 1)
                sampled.append(seq)
        batch = ForwardBatch(
            token_ids=torch.tensor(tokens, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            slots=torch.tensor(slots, dtype=torch.long),
            logit_rows=torch.tensor(rows, dtype=torch.long),
            decode=self._decode_plan(step.decodes) if step.decodes else None,
            prefills=prefills,
        )
        return batch, sampled

    def _decode_plan(self, seqs: list[Sequence]) -> DecodePlan:
        """Runs of each decoding sequence's pages; a prefix shared from the cache becomes one run
        that all its sequences attend to in a single call."""
        ps = self.page_size
        runs = [page_runs(s.pages, s.num_computed + 1, ps) for s in seqs]
        by_start: dict[int, list[int]] = defaultdict(list)
        for i, own in enumerate(runs):
            by_start[own[0].first_page].append(i)
        for members in by_start.values():
            if len(members) < 2:
                continue
            # Cut every member's first run at the whole pages they all hold, so that part is shared.
            common = min(runs[i][0].tokens for i in members) // ps * ps
            for i in members:
                head = runs[i][0]
                if common and head.tokens > common:
                    tail = PageRun(first_page=head.first_page + common // ps, tokens=head.tokens - common)
                    runs[i][0:1] = [PageRun(first_page=head.first_page, tokens=common), tail]
        rows: dict[PageRun, list[int]] = defaultdict(list)
        for i, own in enumerate(runs):
            for run in own:
                rows[run].append(i)
        shared = [SharedRun(run=run, rows=torch.tensor(r, dtype=torch.long)) for run, r in rows.items()]
        return DecodePlan(count=len(seqs), runs=shared, merge=any(len(own) > 1 for own in runs))
