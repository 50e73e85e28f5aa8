"""The engine side of beam search (`adapters.local.beams`): one prompt's beams as running sequences.

The group's first sequence prefills the prompt; its `n - 1` siblings wait in its `forks`. At its
first sample they fork off its pages (`Scheduler.fork`) and the group's best first tokens are
spread over them. Every later step `BeamGroup.advance` reads the rows of all its beams at once,
picks the next beams, rebases the sequences whose beam was dropped onto the kept ones' KV, and at
the end emits the `n` best hypotheses as the request's choices, best first. Nothing streams: a
beam's text is only known once the search ends.
"""

from __future__ import annotations

import torch

from adapters.local.beams import BeamState, Hypothesis, next_beams
from adapters.local.scheduler import Scheduler
from adapters.local.sequence import ChoiceDelta, Sequence, Status
from adapters.local.tokenizer import TextTokenizer


class BeamGroup:
    """One prompt's live beams (sequences) and search state."""

    __slots__ = ("beams", "cached_tokens", "first_index", "members", "prompt_len", "state")

    def __init__(self, leader: Sequence, state: BeamState) -> None:
        self.members = [leader]
        """Every sequence of the group (as many as beams), live or not."""
        self.beams = [leader]
        """The live beams, in the order of `state.cumulative`."""
        self.state = state
        self.first_index = leader.choice_index
        self.prompt_len = leader.prompt_len
        self.cached_tokens = 0

    def advance(
        self,
        rows: dict[int, int],
        logits: torch.Tensor,
        scheduler: Scheduler,
        tokenizer: TextTokenizer,
        max_context: int,
    ) -> list[ChoiceDelta]:
        """One step: `rows` maps a beam's `seq_id` to its logits row. Returns the choices once the
        search ends, else nothing. A beam missing from the step (preempted) is dropped."""
        leader = self.members[0]
        fresh: list[Sequence] = []  # siblings fresh from the fork: they hold the prompt and its KV
        if leader.forks:
            self.cached_tokens = leader.cached_tokens
            fresh = scheduler.fork(leader)
            self.members += fresh
            present = [leader]
        else:
            present = [b for b in self.beams if b.seq_id in rows]
            for beam in self.beams:
                if beam not in present and beam.status is not Status.FINISHED:
                    scheduler.finish(beam, keep_kv=False)
        params = leader.params
        scores = logits[[rows[b.seq_id] for b in present]]
        if not params.greedy:
            scores = scores / params.temperature
        logprobs = torch.log_softmax(scores, dim=-1)
        stop_ids = params.stop_token_ids | frozenset(
            [tokenizer.eos_id] if tokenizer.eos_id is not None else []
        )
        cumulative = self.state.cumulative or [0.0]
        live, ended = next_beams(
            cumulative, logprobs, len(self.members), self.state.width, frozenset(stop_ids)
        )
        for candidate in ended:
            parent = present[candidate.parent]
            self.state.add_ended([*parent.tokens[parent.prompt_len :], candidate.token], candidate.logprob)
        before = [list(b.tokens) for b in present]
        claimed = {id(present[c.parent]) for c in live}
        # Sequences free for a beam: those of dropped beams (or of none); fork-fresh ones first.
        spares = fresh + [m for m in self.members if id(m) not in claimed and m not in fresh]
        beams: list[Sequence] = []
        used: set[int] = set()
        for candidate in live:
            parent = present[candidate.parent]
            if candidate.parent not in used:
                seq = parent
                used.add(candidate.parent)
            else:
                seq = spares.pop(0)
                if seq not in fresh:
                    scheduler.rebase(seq, parent)
                seq.tokens = list(before[candidate.parent])
            seq.tokens.append(candidate.token)
            beams.append(seq)
        for seq in spares:
            if seq.status is not Status.FINISHED:
                scheduler.finish(seq, keep_kv=False)
        self.beams = beams
        self.state.cumulative = [c.logprob for c in live]
        output_len = len(beams[0].tokens) - self.prompt_len if beams else 0
        at_limit = not beams or output_len >= params.max_tokens or len(beams[0].tokens) >= max_context
        if not at_limit and not self.state.is_done(output_len):
            return []
        self.state.stopped_early = not at_limit
        return self._finish(scheduler, tokenizer, stop_ids, at_limit)

    def _finish(
        self, scheduler: Scheduler, tokenizer: TextTokenizer, stop_ids: frozenset[int], at_limit: bool
    ) -> list[ChoiceDelta]:
        """End the search: the best hypotheses (live ones too when it ran to the limit) as choices."""
        live = [
            Hypothesis(tuple(b.tokens[self.prompt_len :]), logprob, stopped=False)
            for b, logprob in zip(self.beams, self.state.cumulative, strict=True)
        ]
        best = self.state.results(live if at_limit else [], self.state.width)
        for beam in self.beams:
            if beam.status is not Status.FINISHED:
                scheduler.finish(beam, keep_kv=True)
        deltas = []
        for rank, hypothesis in enumerate(best):
            tokens = list(hypothesis.tokens)
            text_ids = tokens[:-1] if hypothesis.stopped else tokens
            deltas.append(
                ChoiceDelta(
                    index=self.first_index + rank,
                    token_id=tokens[-1],
                    text=tokenizer.decode(text_ids),
                    finish_reason="stop" if hypothesis.stopped else "length",
                    completion_tokens=len(tokens),
                    cached_tokens=self.cached_tokens if rank == 0 else 0,
                )
            )
        for index in range(len(best), self.state.width):  # fewer hypotheses than beams: a tiny vocabulary
            deltas.append(ChoiceDelta(index=self.first_index + index, token_id=0, finish_reason="stop"))
        return deltas
