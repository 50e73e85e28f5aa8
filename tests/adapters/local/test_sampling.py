"""Next-token selection on synthetic logits: no model needed."""

from __future__ import annotations

import torch

from adapters.local.sampling import SamplerState, SamplingParams, bias_greedy_rows

VOCAB = 50


def logits(*peaks: tuple[int, float]) -> torch.Tensor:
    row = torch.zeros(VOCAB)
    for token, value in peaks:
        row[token] = value
    return row


def draws(params: SamplingParams, row: torch.Tensor, count: int = 200, choice: int = 0) -> list[int]:
    state = SamplerState(params, VOCAB, prompt=[], choice_index=choice)
    return [state.sample(row).token_id for _ in range(count)]


def test_temperature_zero_is_argmax() -> None:
    state = SamplerState(SamplingParams(max_tokens=1, temperature=0.0), VOCAB, [], 0)
    assert state.sample(logits((7, 3.0), (9, 2.9))).token_id == 7


def test_same_seed_same_draws_and_choices_differ() -> None:
    params = SamplingParams(max_tokens=1, temperature=1.0, seed=1234)
    row = torch.linspace(0, 1, VOCAB)
    assert draws(params, row) == draws(params, row)
    assert draws(params, row, choice=0) != draws(params, row, choice=1)


def test_unseeded_requests_differ() -> None:
    params = SamplingParams(max_tokens=1, temperature=1.0)
    row = torch.zeros(VOCAB)
    assert draws(params, row) != draws(params, row)


def test_top_k_keeps_only_the_k_best() -> None:
    row = logits((3, 2.0), (4, 1.9), (5, 1.8))
    assert set(draws(SamplingParams(max_tokens=1, top_k=2, seed=1), row)) == {3, 4}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    row = torch.full((VOCAB,), -20.0)
    row[1], row[2], row[3] = 2.0, 2.0, 0.0  # p ~ 0.44, 0.44, 0.06
    assert set(draws(SamplingParams(max_tokens=1, top_p=0.5, seed=2), row)) == {1, 2}
    assert set(draws(SamplingParams(max_tokens=1, top_p=0.1, seed=2), row)) <= {1, 2}
    assert len(set(draws(SamplingParams(max_tokens=1, top_p=0.1, seed=2), row))) == 1


def test_min_p_drops_tokens_far_below_the_best() -> None:
    row = logits((1, 5.0), (2, 4.5), (3, 1.0))
    seen = set(draws(SamplingParams(max_tokens=1, min_p=0.3, seed=3), row))
    assert seen == {1, 2}


def test_frequency_and_presence_penalties_push_away_repeats() -> None:
    params = SamplingParams(max_tokens=1, temperature=0.0, frequency_penalty=1.0)
    state = SamplerState(params, VOCAB, prompt=[], choice_index=0)
    row = logits((1, 2.0), (2, 1.5))
    assert state.sample(row).token_id == 1
    state.observe(1)
    assert state.sample(row).token_id == 2  # 2.0 - 1.0 < 1.5
    presence = SamplerState(SamplingParams(max_tokens=1, temperature=0.0, presence_penalty=0.4), VOCAB, [], 0)
    presence.observe(1)
    assert presence.sample(row).token_id == 1  # 2.0 - 0.4 > 1.5


def test_repetition_penalty_covers_the_prompt_too() -> None:
    params = SamplingParams(max_tokens=1, temperature=0.0, repetition_penalty=1.5)
    row = logits((1, 2.0), (2, 1.5))
    assert SamplerState(params, VOCAB, prompt=[1], choice_index=0).sample(row).token_id == 2  # 2.0 / 1.5
    assert SamplerState(params, VOCAB, prompt=[], choice_index=0).sample(row).token_id == 1


def test_logit_bias_can_ban_a_token() -> None:
    params = SamplingParams(max_tokens=1, temperature=0.0, logit_bias=((1, -100.0),))
    assert SamplerState(params, VOCAB, [], 0).sample(logits((1, 5.0), (2, 1.0))).token_id == 2


def test_batched_greedy_rows_are_biased_in_place_and_others_left_alone() -> None:
    banned = SamplingParams(max_tokens=1, temperature=0.0, logit_bias=((1, -100.0), (3, 2.0)))
    reporting = SamplingParams(max_tokens=1, temperature=0.0, logprobs=True, logit_bias=((1, -100.0),))
    sampled = SamplingParams(max_tokens=1, temperature=1.0, logit_bias=((1, -100.0),))
    step = torch.stack([logits((1, 5.0), (2, 1.0)), logits((1, 5.0)), logits((1, 5.0)), logits((4, 1.0))])
    before = step.clone()
    bias_greedy_rows(step, [banned, reporting, sampled, SamplingParams(max_tokens=1, temperature=0.0)])
    assert step.argmax(dim=-1).tolist()[0] == 3  # 1 banned, 3 lifted above 2
    assert step[0, 1] == -95.0 and step[0, 3] == 2.0
    # Rows whose sampler applies the bias itself (logprobs, sampling) or that have none: untouched.
    assert torch.equal(step[1:], before[1:])


def test_logprobs_report_the_model_distribution() -> None:
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=2)
    row = logits((1, 3.0), (2, 2.0))
    picked = SamplerState(params, VOCAB, [], 0).sample(row)
    expected = torch.log_softmax(row, dim=-1)
    assert picked.logprob is not None
    assert picked.logprob.token_id == 1
    assert abs(picked.logprob.logprob - float(expected[1])) < 1e-6
    assert [t for t, _ in picked.logprob.top] == [1, 2]
