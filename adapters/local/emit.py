"""From a step's logits to each sequence's new tokens: sampling, stop rules, and the verification
of speculative drafts (`adapters.local.drafts`).

A sequence that verified a draft this step has `1 + len(draft)` logits rows: row `j` is the model's
next-token distribution after the draft's first `j` tokens. Its tokens are picked row by row while
the draft holds:

- greedy: the row's argmax (after the request's bias and penalties); the draft holds while it agrees,
  so the tokens are exactly those of greedy decoding without speculation;
- sampling (speculative sampling with a draft that is one token, q = 1 on it): draft token `d` is
  accepted with probability p(d) (min(1, p/q)); rejected, the row's token is drawn from p without
  `d`, renormalised (the residual max(0, p - q)); either way the token has distribution p.
  A seeded request does not speculate: its draws would then depend on what was drafted, which the
  prefix cache's other requests shape, and a seed promises repeatability.

Then the longest agreeing prefix plus the model's own next token are the sequence's new tokens; the
K/V of rejected draft tokens lies past `num_computed`, in pages released here.
"""

from __future__ import annotations

import torch

from adapters.local.drafts import Drafter
from adapters.local.linear import FUSED_MAX_ROWS
from adapters.local.sampling import SamplingParams
from adapters.local.scheduler import ScheduledStep, Scheduler
from adapters.local.sequence import ChoiceDelta, Sequence, Status

MAX_DECODE_ROWS = FUSED_MAX_ROWS
"""Decode rows a step may grow to with draft tokens, at most: within the exact kernel's rows per
call, so a draft row is computed as it would be as the sequence's next decode row. A model may
allow fewer (`LlamaModel.decode_row_limit`)."""


def can_speculate(params: SamplingParams) -> bool:
    """Greedy requests, and sampled ones without a seed (see the module's docstring); not beams."""
    return not params.beam_search and (params.greedy or params.seed is None)


class TokenEmitter:
    """Drafts before a step and turns its logits into `ChoiceDelta`s after it. Engine thread only."""

    def __init__(
        self,
        scheduler: Scheduler,
        eos_id: int | None,
        max_context: int,
        drafter: Drafter | None,
        max_rows: int | None = None,
    ) -> None:
        """`max_rows`: the most rows a decode step may have with its drafts (see `draft`); None:
        `MAX_DECODE_ROWS`."""
        self.scheduler = scheduler
        self.max_rows = min(max_rows or MAX_DECODE_ROWS, MAX_DECODE_ROWS)
        self.eos_id = eos_id
        self.max_context = max_context
        self.drafter = drafter

    def draft(self, step: ScheduledStep) -> None:
        """Give each decoding sequence that speculates its draft for this step, within the step's
        rows (`max_rows`), its token limit and the context. Drafts only fill rows a step has to
        spare: a full batch's products are compute-bound, so verification rows would cost it more
        than they save, and past the model's row limit its products take a slower kernel."""
        if self.drafter is None:
            return
        budget = self.max_rows - len(step.decodes)
        for seq in step.decodes:
            if seq.spec is None or budget <= 0:
                continue
            room = min(seq.params.max_tokens - seq.output_len, self.max_context - len(seq.tokens)) - 1
            draft = self.drafter.propose(seq.spec, seq.salt, seq.tokens, seq.output_len, min(room, budget))
            if draft:
                seq.draft = draft[: self.scheduler.reserve_draft(seq, len(draft))]
                budget -= len(seq.draft)

    def advance(
        self, seq: Sequence, logits: torch.Tensor, argmax: list[int], first: int
    ) -> list[ChoiceDelta]:
        """`seq`'s new tokens from its rows, which start at `first` (one row without a draft)."""
        draft, seq.draft = seq.draft, []
        deltas: list[ChoiceDelta] = []
        for offset in range(len(draft) + 1):
            seq.num_computed = len(seq.tokens)  # the K/V of the accepted draft tokens is in place
            drafted = draft[offset] if offset < len(draft) else None
            delta = self._emit(seq, logits[first + offset], argmax[first + offset], drafted)
            deltas.append(delta)
            if delta.finish_reason is not None or delta.token_id != drafted:
                break
        if draft and seq.spec is not None and self.drafter is not None:
            accepted = sum(d.token_id == t for d, t in zip(deltas, draft, strict=False))
            self.drafter.settle(seq.spec, len(draft), accepted, len(deltas), seq.output_len)
            if seq.status is not Status.FINISHED:
                self.scheduler.trim_pages(seq)
        if deltas[-1].finish_reason is not None and seq.spec is not None:
            deltas[-1].accepted_drafts, deltas[-1].rejected_drafts = seq.spec.accepted, seq.spec.rejected
        return deltas

    def _emit(self, seq: Sequence, logits: torch.Tensor, argmax: int, drafted: int | None) -> ChoiceDelta:
        """Pick one token (verifying `drafted` where the request samples), append it, apply the stop rules."""
        params = seq.params
        if params.batched_greedy:
            token, logprob = argmax, None
        else:
            picked = seq.sampler.sample(logits, drafted)
            token, logprob = picked.token_id, picked.logprob
        seq.tokens.append(token)
        seq.sampler.observe(token)
        if seq.grammar is not None:
            seq.grammar.advance(token)
        delta = ChoiceDelta(
            index=seq.choice_index, token_id=token, logprobs=[logprob] if logprob is not None else []
        )
        reason: str | None = None
        if token == self.eos_id or token in params.stop_token_ids:
            reason = "stop"
            delta.text = seq.text.finish()
        else:
            delta.text, stopped = seq.text.push(token)
            if stopped:
                reason = "stop"
            elif seq.output_len >= params.max_tokens or (
                seq.window is None and len(seq.tokens) >= self.max_context
            ):
                reason = "length"
                delta.text += seq.text.finish()
        if reason is not None:
            self.scheduler.finish(seq, keep_kv=True)
            delta.finish_reason = reason
            delta.completion_tokens = seq.output_len
            delta.cached_tokens = seq.cached_tokens if seq.reports_cache else 0
        return delta
