"""Beam search: the search against brute force on a toy model, width 1 against greedy decoding,
then the real engine (ranked, deterministic choices; beams on shared pages; refusals)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from adapters.errors import InvalidRequest
from adapters.local import LocalEngine
from adapters.local.beam_group import BeamGroup
from adapters.local.beams import BeamState
from adapters.local.sampling import SamplingParams
from adapters.local.scheduler import Scheduler
from adapters.local.sequence import GenerationJob, Sequence, Status
from adapters.local.tokenizer import TextTokenizer
from tests.adapters.local.conftest import chat

VOCAB, EOS, DEPTH = 4, 0, 3


def toy_logits(output: tuple[int, ...]) -> torch.Tensor:
    """A fixed random next-token distribution per prefix."""
    seed = sum(t * VOCAB**i for i, t in enumerate(output)) + 7 * len(output)
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


class ToyScheduler:
    """What `BeamGroup` asks of the scheduler, without pages."""

    def fork(self, leader: Sequence) -> list[Sequence]:
        children, leader.forks = leader.forks, []
        for child in children:
            child.tokens = list(leader.tokens)
            child.status = Status.RUNNING
        return children

    def rebase(self, seq: Sequence, onto: Sequence) -> None:
        seq.status = Status.RUNNING  # pages only otherwise: the group sets the tokens

    def finish(self, seq: Sequence, *, keep_kv: bool) -> None:
        seq.status = Status.FINISHED


def toy_search(width: int, length_penalty: float, early_stopping: bool = False) -> list[tuple[str, str]]:
    """`BeamGroup` driven over the toy model: each choice's (text, finish reason), best first."""
    params = SamplingParams(
        max_tokens=DEPTH, temperature=0.0, beam_search=True, length_penalty=length_penalty
    )
    job = GenerationJob(job_id=1, groups=[], params=params, salt="", sink=lambda events: None)
    beams = [Sequence(job, [1], i, None, None) for i in range(width)]  # type: ignore[arg-type]
    leader = beams[0]
    leader.forks = beams[1:]
    leader.status = Status.RUNNING
    group = BeamGroup(leader, BeamState(width, length_penalty, early_stopping))
    tokenizer = cast(TextTokenizer, SimpleNamespace(eos_id=EOS, decode=lambda ids: ",".join(map(str, ids))))
    scheduler = cast(Scheduler, ToyScheduler())
    for _ in range(DEPTH):
        live = group.beams
        logits = torch.stack([toy_logits(tuple(b.tokens[1:])) for b in live])
        rows = {b.seq_id: i for i, b in enumerate(live)}
        choices = group.advance(rows, logits, scheduler, tokenizer, max_context=100)
        if choices:
            assert [c.index for c in choices] == list(range(width))
            return [(c.text, c.finish_reason or "") for c in choices]
    raise AssertionError("the search did not end at max_tokens")


def brute_force(length_penalty: float) -> list[tuple[str, str]]:
    """Every hypothesis of up to DEPTH tokens (ended by EOS, or at the depth), best first."""
    scored = []
    for length in range(1, DEPTH + 1):
        for tokens in itertools.product(range(VOCAB), repeat=length):
            if EOS in tokens[:-1] or (length < DEPTH and tokens[-1] != EOS):
                continue
            logprob = sum(
                float(torch.log_softmax(toy_logits(tokens[:i]), -1)[t]) for i, t in enumerate(tokens)
            )
            stopped = tokens[-1] == EOS
            text = ",".join(map(str, tokens[:-1] if stopped else tokens))
            scored.append((logprob / length**length_penalty, text, "stop" if stopped else "length"))
    scored.sort(key=lambda item: -item[0])
    return [(text, reason) for _, text, reason in scored]


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_a_wide_enough_search_finds_the_brute_force_ranking(length_penalty: float) -> None:
    """Width VOCAB ** (DEPTH - 1) keeps every prefix: the search is exhaustive, so its beams are the
    true best hypotheses, in the true order."""
    width = VOCAB ** (DEPTH - 1)
    assert toy_search(width, length_penalty) == brute_force(length_penalty)[:width]


def test_width_one_is_greedy_and_narrow_searches_are_deterministic() -> None:
    greedy: list[int] = []
    while len(greedy) < DEPTH and (not greedy or greedy[-1] != EOS):
        greedy.append(int(toy_logits(tuple(greedy)).argmax()))
    stopped = greedy[-1] == EOS
    expected = ",".join(map(str, greedy[:-1] if stopped else greedy))
    assert toy_search(1, 1.0) == [(expected, "stop" if stopped else "length")]
    assert toy_search(3, 1.0) == toy_search(3, 1.0)
    # The best of a narrow search is never better than the true best.
    assert brute_force(0.0).index(toy_search(2, 0.0)[0]) >= 0


def complete(engine: LocalEngine, content: str, **fields: Any) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        answer: dict[str, Any] = json.loads((await engine.complete(chat(content, **fields))).body)
        return answer

    return asyncio.run(go())


@pytest.mark.slow
def test_engine_beams_rank_deterministically_and_width_one_is_greedy(
    make_engine: Callable[..., LocalEngine],
) -> None:
    engine = make_engine(beam_width=4, radix_cache=False)
    question = "Name three fruits."
    greedy = complete(engine, question, max_tokens=16, temperature=0)
    one = complete(engine, question, max_tokens=16, n=1, use_beam_search=True)
    assert one["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
    four = complete(engine, question, max_tokens=16, n=4, use_beam_search=True, length_penalty=0.5)
    again = complete(engine, question, max_tokens=16, n=4, use_beam_search=True, length_penalty=0.5)
    texts = [c["message"]["content"] for c in four["choices"]]
    assert texts == [c["message"]["content"] for c in again["choices"]] and len(set(texts)) == 4
    assert all(c["finish_reason"] in ("stop", "length") for c in four["choices"])
    stats = engine.stats()
    assert stats is not None and stats.pool_pages_free == stats.pool_pages_total
    assert stats.beam_searches == 3


def test_beam_search_refusals(engine: LocalEngine) -> None:
    for fields, param in (
        ({"n": 99}, "n"),
        ({"stream": True}, "stream"),
        ({"top_p": 0.5}, "top_p"),
        ({"seed": 3}, "seed"),
    ):
        with pytest.raises(InvalidRequest) as refused:
            complete(engine, "Hi", max_tokens=4, use_beam_search=True, **fields)
        assert refused.value.param == param
    with pytest.raises(InvalidRequest):
        complete(engine, "Hi", max_tokens=4, length_penalty=2.0)


def test_beam_search_refuses_a_grammar_and_an_asked_for_window(engine: LocalEngine) -> None:
    """Beams advance no grammar and share pages a window would rotate: both are 400s naming the field."""
    with pytest.raises(InvalidRequest) as refused:
        complete(engine, "Hi", max_tokens=4, use_beam_search=True, response_format={"type": "json_object"})
    assert refused.value.param == "response_format"
    request = chat("Hi", max_tokens=4, use_beam_search=True)
    request.sliding_window = True
    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(engine.complete(request))
    assert refused.value.param == "enable_sliding_window"
