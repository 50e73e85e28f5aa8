"""Turn one row of logits into the next token: penalties, bias, temperature, top-k/p, min-p.

Order (as vLLM applies them): logit bias, repetition penalty (prompt and output tokens, the
`transformers` rule: divide positive logits, multiply negative ones), frequency and presence
penalties (output tokens only, OpenAI's formula), then greedy argmax when temperature is 0, or
temperature, top-k, top-p, min-p and a draw from the sequence's own `torch.Generator`.

Every sequence owns its generator, seeded from the request's `seed` (plus the choice index, so
n>1 choices differ), which makes a seeded request repeatable whatever else shares the batch.

Logprobs are those of the model's own distribution (log-softmax of the raw logits, before
penalties, temperature and truncation), as vLLM reports them by default.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch

GREEDY_EPSILON = 1e-5
"""Temperatures below this sample greedily (argmax), as vLLM does."""


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """Validated sampling settings of one request (shared by its n choices)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    beam_search: bool = False
    """vLLM's `use_beam_search`: `n` beams (`adapters.local.beams`) instead of `n` samples."""
    length_penalty: float = 1.0
    """Beam search ranks hypotheses by `logprob / length ** length_penalty`."""
    early_stopping: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON

    @property
    def needs_history(self) -> bool:
        """True when sampling reads the tokens seen so far (any penalty is on)."""
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def batched_greedy(self) -> bool:
        """Greedy with nothing that reports the distribution or reads the history: the step's
        logits row, biased in place (`bias_greedy_rows`), then one argmax for the whole batch."""
        return self.greedy and not self.needs_history and not self.logprobs


@dataclass(slots=True)
class TokenLogprob:
    """The chosen token's log-probability and the most likely alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class SampledToken:
    token_id: int
    logprob: TokenLogprob | None = None


class SamplerState:
    """Per-sequence sampling state: the generator and the token history penalties read."""

    __slots__ = ("counts", "generator", "params", "prompt_mask")

    def __init__(self, params: SamplingParams, vocab_size: int, prompt: list[int], choice_index: int) -> None:
        self.params = params
        seed = params.seed + choice_index if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
        self.counts: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None
        if params.needs_history:
            self.counts = torch.zeros(vocab_size, dtype=torch.float32)
            self.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool)
            if prompt:
                self.prompt_mask[torch.tensor(prompt, dtype=torch.long)] = True

    def observe(self, token_id: int) -> None:
        """Record a generated token for the penalties."""
        if self.counts is not None:
            self.counts[token_id] += 1.0

    def sample(self, logits: torch.Tensor, drafted: int | None = None) -> SampledToken:
        """Pick the next token from one fp32 logits row `[vocab]`. `drafted`: a speculative draft's
        token for this position, which a sampled request accepts with its probability and else
        draws from the rest (`verify`); the token's distribution is the row's either way."""
        params = self.params
        report = _logprobs(logits, params.top_logprobs) if params.logprobs else None
        scores = self._adjusted(logits)
        if params.greedy:
            token = int(torch.argmax(scores))
        else:
            probs = self._probs(scores)
            token = self._draw(probs) if drafted is None else self.verify(probs, drafted)
        return SampledToken(token_id=token, logprob=report(token) if report is not None else None)

    def verify(self, probs: torch.Tensor, drafted: int) -> int:
        """Speculative sampling's acceptance for a one-token draft (q = 1 on `drafted`): keep it with
        probability p(drafted) = min(1, p/q); else draw from the residual max(0, p - q), which is
        p without `drafted`. `probs` (`_probs`, not necessarily normalised) is consumed."""
        probs = probs / probs.sum()
        if float(torch.rand((), generator=self.generator)) < float(probs[drafted]):
            return drafted
        probs[drafted] = 0.0
        return self._draw(probs)

    def _adjusted(self, logits: torch.Tensor) -> torch.Tensor:
        params = self.params
        if not params.logit_bias and self.counts is None:
            return logits
        scores = logits.clone()
        for token, bias in params.logit_bias:
            scores[token] += bias
        if self.counts is not None and self.prompt_mask is not None:
            seen = self.counts > 0
            if params.repetition_penalty != 1.0:
                hit = seen | self.prompt_mask
                penalized = torch.where(
                    scores > 0, scores / params.repetition_penalty, scores * params.repetition_penalty
                )
                scores = torch.where(hit, penalized, scores)
            scores -= params.frequency_penalty * self.counts + params.presence_penalty * seen.float()
        return scores

    def _draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def _probs(self, scores: torch.Tensor) -> torch.Tensor:
        """The distribution to draw from, after temperature, top-k, top-p and min-p (unnormalised
        after min-p)."""
        params = self.params
        scores = scores / params.temperature
        if 0 < params.top_k < scores.shape[0]:
            kth = torch.topk(scores, params.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if params.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True)
            sorted_probs = torch.softmax(ordered, dim=-1)
            drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p  # keep the token crossing p
            scores = scores.scatter(0, order[drop], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if params.min_p > 0.0:
            probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
        return probs


def _logprobs(logits: torch.Tensor, top: int) -> _LogprobReport:
    return _LogprobReport(torch.log_softmax(logits, dim=-1), top)


class _LogprobReport:
    __slots__ = ("_logprobs", "_top")

    def __init__(self, logprobs: torch.Tensor, top: int) -> None:
        self._logprobs = logprobs
        self._top = top

    def __call__(self, token: int) -> TokenLogprob:
        alternatives: list[tuple[int, float]] = []
        if self._top > 0:
            values, ids = torch.topk(self._logprobs, self._top)
            alternatives = list(zip(ids.tolist(), values.tolist(), strict=True))
        return TokenLogprob(token_id=token, logprob=float(self._logprobs[token]), top=alternatives)


def bias_greedy_rows(logits: torch.Tensor, rows: list[SamplingParams]) -> None:
    """Add each batched-greedy row's `logit_bias` to its row of the step's `[rows, vocab]` logits, in
    place and in one op: a per-row copy of 49k logits, biased, then its own argmax cost ~0.3 ms
    a row (5 ms of a 16-stream step whose requests all set a bias, as benchmarks that ignore EOS do)."""
    picked = [
        (row, token, bias) for row, p in enumerate(rows) if p.batched_greedy for token, bias in p.logit_bias
    ]
    if not picked:
        return
    row_ids, token_ids, biases = zip(*picked, strict=True)
    with torch.inference_mode():  # the step's logits are inference tensors (`ModelRunner.run`)
        logits.index_put_(
            (torch.tensor(row_ids), torch.tensor(token_ids)),
            torch.tensor(biases, dtype=logits.dtype),
            accumulate=True,
        )
