"""Speculative sampling keeps the sampling distribution: chi-square tests on a small vocabulary
slice with fixed seeds, for one verified position and for a two-token draft's joint distribution."""

from __future__ import annotations

import torch

from adapters.local.emit import can_speculate
from adapters.local.sampling import SamplerState, SamplingParams

TRIALS = 10_000
CHI2_999 = {4: 18.47, 6: 22.46, 35: 66.62}
"""Chi-square critical values at p = 0.001 by degrees of freedom."""


def chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def sampler(seed: int, **params: float) -> SamplerState:
    return SamplerState(SamplingParams(max_tokens=1, seed=seed, **params), 7, [], 0)  # type: ignore[arg-type]


def test_a_verified_position_has_the_rows_distribution() -> None:
    logits = torch.tensor([1.5, 0.2, 2.0, -1.0, 0.7, 0.0, 1.1])
    for temperature, top_k in ((0.8, 0), (1.3, 5)):
        state = sampler(7, temperature=temperature, top_k=top_k)
        scaled = logits / temperature
        if top_k:
            scaled = scaled.masked_fill(scaled < scaled.topk(top_k).values[-1], float("-inf"))
        expected_p = torch.softmax(scaled, -1)
        for drafted in (2, 3):  # a likely and an unlikely draft token
            counts = torch.zeros(7)
            for _ in range(TRIALS):
                counts[state.sample(logits, drafted).token_id] += 1
            support = expected_p > 0
            stat = chi_square(counts[support], TRIALS * expected_p[support])
            assert stat < CHI2_999[int(support.sum()) - 1], (temperature, drafted, stat)
            assert counts[~support].sum() == 0  # top-k's dropped tokens never come out


def test_a_two_token_draft_keeps_the_joint_distribution() -> None:
    """A toy model p(t1) p(t2 | t1) over 6 tokens, draft (1, 3): the second row is verified only when
    the first token is the draft's, as the engine does; otherwise t2 is drawn the next step."""
    generator = torch.Generator().manual_seed(3)
    first = torch.randn(6, generator=generator)
    second = torch.randn(6, 6, generator=generator)
    state = SamplerState(SamplingParams(max_tokens=2, seed=11), 6, [], 0)
    counts = torch.zeros(6, 6)
    for _ in range(TRIALS):
        t1 = state.sample(first, 1).token_id
        t2 = state.sample(second[t1], 3 if t1 == 1 else None).token_id
        counts[t1, t2] += 1
    joint = torch.softmax(first, -1)[:, None] * torch.softmax(second, -1)
    assert chi_square(counts.view(-1), TRIALS * joint.view(-1)) < CHI2_999[35]


def test_seeded_sampling_does_not_speculate() -> None:
    assert can_speculate(SamplingParams(max_tokens=1, temperature=0.0, seed=1))
    assert can_speculate(SamplingParams(max_tokens=1, temperature=0.7))
    assert not can_speculate(SamplingParams(max_tokens=1, temperature=0.7, seed=1))
