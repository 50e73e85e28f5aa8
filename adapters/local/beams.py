"""Beam search (vLLM's `use_beam_search` extension): `n` beams of one prompt, kept by cumulative
log-probability, ranked at the end by `logprob / length ** length_penalty`.

Each step every live beam is one decode row of the batch. From their next-token log-probabilities
(the model's own: log-softmax of the raw logits) the `2 * width` best continuations are taken in
rank order: a stop token (EOS or `stop_token_ids`) among the first `width` ranks ends a hypothesis;
the others become the next live beams until as many as before are chosen (`next_beams`). A beam
continued by several children lends its sequence to the first; the others take over the
sequences of beams that were dropped and are rebased onto its KV (`Scheduler.rebase`): its whole
pages shared, copy-on-write, only the partial last page copied.

The search ends when `max_tokens` is reached, or early (`early_stopping`): with `true`, as soon as
`width` hypotheses have ended; with `false`, once no live beam can still beat the worst of the best
`width` ended ones (the length-normalised score of its log-probability so far, as `transformers`
estimates it). Ties keep the lower beam and token order, so a search is deterministic; width 1 is
greedy decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from adapters.local.sampling import SamplingParams


class Candidate(NamedTuple):
    """A continuation: beam `parent` followed by `token`, with its cumulative log-probability."""

    parent: int
    token: int
    logprob: float


@dataclass(slots=True, frozen=True)
class Hypothesis:
    """An ended (or, at the end, still live) beam's output."""

    tokens: tuple[int, ...]
    logprob: float
    stopped: bool
    """Ended on a stop token (finish reason `stop`), not at `max_tokens`."""

    def score(self, length_penalty: float) -> float:
        return self.logprob / math.pow(max(len(self.tokens), 1), length_penalty)


def next_beams(
    cumulative: list[float], logprobs: torch.Tensor, keep: int, width: int, stop_ids: frozenset[int]
) -> tuple[list[Candidate], list[Candidate]]:
    """(live, ended) continuations of beams with log-probabilities so far `cumulative` and next-token
    log-probabilities `logprobs` `[beams, vocab]`: at most `keep` live ones, in rank order."""
    total = logprobs + torch.tensor(cumulative, dtype=logprobs.dtype)[:, None]
    vocab = total.shape[1]
    count = min(2 * width, total.numel())
    values, flat = torch.topk(total.view(-1), count)
    ranked = sorted(zip(values.tolist(), flat.tolist(), strict=True), key=lambda c: (-c[0], c[1]))
    live: list[Candidate] = []
    ended: list[Candidate] = []
    for rank, (value, index) in enumerate(ranked):
        candidate = Candidate(parent=index // vocab, token=index % vocab, logprob=value)
        if candidate.token in stop_ids:
            if rank < width:
                ended.append(candidate)
        elif len(live) < keep:
            live.append(candidate)
        if len(live) == keep:
            break
    return live, ended


@dataclass(slots=True)
class BeamState:
    """One prompt's beam search: settings, the live beams' log-probabilities, ended hypotheses."""

    width: int
    length_penalty: float
    early_stopping: bool
    cumulative: list[float] = field(default_factory=list)
    """Per live beam, in the order of the group's sequences."""
    ended: list[Hypothesis] = field(default_factory=list)
    stopped_early: bool = False

    @classmethod
    def of(cls, params: SamplingParams, width: int) -> BeamState:
        """A new search of `width` beams with the request's settings."""
        return cls(width=width, length_penalty=params.length_penalty, early_stopping=params.early_stopping)

    def add_ended(self, tokens: list[int], logprob: float) -> None:
        self.ended.append(Hypothesis(tuple(tokens), logprob, stopped=True))

    def is_done(self, output_len: int) -> bool:
        """Whether the search can stop before `max_tokens` (see the module's docstring)."""
        if len(self.ended) < self.width:
            return False
        if self.early_stopping:
            return True
        best = sorted((h.score(self.length_penalty) for h in self.ended), reverse=True)[: self.width]
        reachable = (
            max(self.cumulative, default=float("-inf")) / float(max(output_len, 1)) ** self.length_penalty
        )
        return bool(reachable <= best[-1])

    def results(self, live: list[Hypothesis], n: int) -> list[Hypothesis]:
        """The `n` best hypotheses, ended ones and `live` ones together, best first (stable)."""
        pool = self.ended + live
        order = sorted(range(len(pool)), key=lambda i: -pool[i].score(self.length_penalty))
        return [pool[i] for i in order[:n]]
