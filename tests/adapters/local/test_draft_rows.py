"""Speculative drafts fill only the rows a decode step has to spare (`TokenEmitter.draft`): a full
batch drafts nothing, and no step grows past the model's row limit (`LlamaModel.decode_row_limit`:
on torch's path the int4 kernel's rows, past which every row would take the fp32 copy)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.local.emit import MAX_DECODE_ROWS, TokenEmitter
from adapters.local.loader import LoadedModel, load_model
from adapters.local.scheduler import ScheduledStep
from adapters.local.stock_linear import INT4_MAX_ROWS


class _Drafter:
    """Proposes `want` tokens to every sequence (as many as its room allows)."""

    def __init__(self, want: int) -> None:
        self.want = want

    def propose(self, state: Any, salt: str, tokens: list[int], output_len: int, room: int) -> list[int]:
        return [7] * min(self.want, room)


class _Scheduler:
    def reserve_draft(self, seq: Any, tokens: int) -> int:
        return tokens


def _decoding(count: int) -> list[Any]:
    params = SimpleNamespace(max_tokens=1000)
    return [
        SimpleNamespace(spec=object(), params=params, output_len=0, tokens=[1] * 10, salt="", draft=[])
        for _ in range(count)
    ]


def _rows(max_rows: int | None, sequences: int, want: int) -> int:
    emitter = TokenEmitter(_Scheduler(), None, 4096, _Drafter(want), max_rows)  # type: ignore[arg-type]
    step = ScheduledStep(decodes=_decoding(sequences))
    emitter.draft(step)
    return sum(1 + len(seq.draft) for seq in step.decodes)


@pytest.mark.parametrize("sequences", [1, 4, 15, 16, 20])
def test_drafts_never_take_a_step_past_the_row_limit(sequences: int) -> None:
    assert _rows(INT4_MAX_ROWS, sequences, want=8) == max(sequences, min(INT4_MAX_ROWS, 9 * sequences))


def test_a_full_batch_drafts_nothing() -> None:
    assert _rows(INT4_MAX_ROWS, INT4_MAX_ROWS, want=8) == INT4_MAX_ROWS


def test_without_a_limit_of_the_model_the_kernel_rows_bound_the_step() -> None:
    assert _rows(None, 8, want=16) == MAX_DECODE_ROWS
    assert _rows(10 * MAX_DECODE_ROWS, 8, want=16) == MAX_DECODE_ROWS


def test_the_row_limit_is_the_int4_kernels_on_torchs_packed_path(
    tiny_model: tuple[Any, LoadedModel],
) -> None:
    config, _ = tiny_model
    packed = load_model(replace(config, c_kernels=False, decode_weights="packed")).model
    exact = load_model(replace(config, c_kernels=False, decode_weights="fp32")).model
    assert packed.serves_packed and packed.decode_row_limit == INT4_MAX_ROWS
    assert not exact.serves_packed and exact.decode_row_limit is None
