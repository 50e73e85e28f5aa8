"""Decode rows on packed weights through torch's kernels (`stock_linear`): the path of every host
without the C kernels, run here on any host (`c_kernels = False`), in its shipped prompt mode
(`prefill_activations = "auto"`). Products close to the exact ones, prompt rows exact or, on a
bfloat16 or fp16 copy, close, batched answers the single ones but at near ties, the usual answers
unchanged."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from adapters.local import LocalEngine, stock_linear
from adapters.local.gguf_convert import _q4_1_parts, _q8_0_parts
from adapters.local.linear import DenseLinear, dequantize_q8_0, interleave_q4_1
from adapters.local.loader import LoadedModel, load_model
from adapters.local.sampling import SamplingParams, TokenLogprob
from adapters.local.stock_linear import (
    FBGEMM_FP16_BLOCK_ROWS,
    INT4_AVX2_MAX_ROWS,
    INT4_MAX_ROWS,
    Fp16Dense,
    Fp16Head,
    Int4Linear,
    Int8Head,
    TokenTable,
    fbgemm_fp16,
    fp16_dense,
    fp16_head,
    int4_linear,
    int4_max_rows,
    int8_head,
    packed_head,
    prompt_weights,
)
from tests.adapters.local.conftest import TEST_CONFIG, chat
from tests.adapters.local.test_equivalence import chat_ids
from tests.adapters.local.test_kernels import _gguf_tensor, _q4_1_weight

STOCK = replace(TEST_CONFIG, c_kernels=False, decode_weights="packed", prefill_activations="auto")


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("rows", [1, 3, INT4_MAX_ROWS])
def test_int4_decode_rows_are_close_and_the_rest_exact(rows: int) -> None:
    tensor, weight = _q4_1_weight(96, 128, seed=rows)
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    linear = int4_linear(packed, scale, offset, DenseLinear(weight.t().contiguous()))
    x = torch.randn(rows + 5, 128)
    expected = x @ weight.t()
    decode = linear.mm(x, decode_rows=rows)
    assert _relative_error(decode[:rows], expected[:rows]) < 1e-2  # bf16 activations, scales, outputs
    assert torch.equal(decode[rows:], x[rows:] @ weight.t().contiguous())
    residual = torch.randn(rows + 5, 96)
    into = residual.clone()
    linear.addmm_(into, x, decode_rows=rows)
    torch.testing.assert_close(into[rows:], residual[rows:] + expected[rows:], rtol=1e-5, atol=1e-5)
    assert _relative_error(into[:rows] - residual[:rows], expected[:rows]) < 1e-2
    assert torch.equal(linear.mm(x), x @ weight.t().contiguous())  # no decode rows: exact


def test_more_decode_rows_than_the_int4_kernel_takes_are_exact() -> None:
    """A step of many decode rows (a full batch, verification rows) runs all of them in MKL."""
    tensor, weight = _q4_1_weight(96, 128, seed=8)
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    weight_t = weight.t().contiguous()
    linear = int4_linear(packed, scale, offset, DenseLinear(weight_t))
    x = torch.randn(INT4_MAX_ROWS + 3, 128)
    assert torch.equal(linear.mm(x, decode_rows=INT4_MAX_ROWS + 1), x @ weight_t)
    into = torch.zeros(x.shape[0], 96)
    linear.addmm_(into, x, decode_rows=INT4_MAX_ROWS + 1)
    assert torch.equal(into, torch.zeros(x.shape[0], 96).addmm_(x, weight_t))


def test_int4_rows_do_not_depend_on_what_shares_the_call() -> None:
    tensor, weight = _q4_1_weight(64, 96, seed=5)
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    linear = int4_linear(packed, scale, offset, DenseLinear(weight.t().contiguous()))
    x = torch.randn(INT4_MAX_ROWS, 96)
    together = linear.mm(x, decode_rows=INT4_MAX_ROWS)
    for row in (0, 4, INT4_MAX_ROWS - 1):
        assert torch.equal(linear.mm(x[row : row + 1], decode_rows=1)[0], together[row])


@pytest.mark.parametrize(("native", "fbgemm"), [(True, True), (False, True), (False, False)])
def test_prompt_rows_take_the_fastest_dense_copy_the_host_has(
    monkeypatch: pytest.MonkeyPatch, native: bool, fbgemm: bool
) -> None:
    monkeypatch.setattr(stock_linear, "native_bf16_matmul", lambda: native)
    monkeypatch.setattr(stock_linear, "fbgemm_fp16", lambda: fbgemm)
    expected = "bfloat16" if native else "float16" if fbgemm else "model"
    assert prompt_weights("auto", torch.float32) == expected
    assert prompt_weights("fp32", torch.float32) == "model"  # exact, as asked
    assert prompt_weights("int8", torch.float32) == "model"  # the C kernels' mode
    assert prompt_weights("auto", torch.bfloat16) == "model"  # the model's own dtype


def test_int4_kernel_takes_two_decode_rows_with_avx2_code_beside_an_fp16_copy() -> None:
    """Where torch's int4 kernel runs its AVX2 code, fbgemm's fp16 copy wins from three rows; with
    any other code, or beside another copy, the int4 kernel keeps up to 16."""
    for dense in (DenseLinear(torch.randn(64, 8)), DenseLinear(torch.randn(64, 8).bfloat16())):
        assert int4_max_rows(dense, "AVX2") == int4_max_rows(dense, "AVX512") == INT4_MAX_ROWS
        assert int4_max_rows(dense, "DEFAULT") == INT4_MAX_ROWS
    if fbgemm_fp16():  # x86: the only hosts with an fp16 copy
        fp16 = fp16_dense(torch.randn(8, 64))
        assert int4_max_rows(fp16, "AVX2") == INT4_AVX2_MAX_ROWS == 2
        assert int4_max_rows(fp16, "AVX512") == INT4_MAX_ROWS


@pytest.mark.skipif(not fbgemm_fp16(), reason="fbgemm is x86-only; there the copy is bfloat16 or fp32")
@pytest.mark.parametrize("code", ["AVX2", "AVX512"])
@pytest.mark.parametrize("decode_rows", [0, 2, 3, INT4_MAX_ROWS, INT4_MAX_ROWS + 1])
def test_rows_on_an_fp16_copy_are_close_and_keep_their_dtype(
    monkeypatch: pytest.MonkeyPatch, code: str, decode_rows: int
) -> None:
    """Prompt rows (and all rows of a step past `int4_max_rows`: 2 with AVX2 code, else 16) on the
    fp16 copy in fbgemm: within fp16 rounding of the weights, fp32 rows in and out; the int4 rows
    are as they were. Either code's rule is tested on any x86 host (the rule, not the kernels)."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: code)
    tensor, weight = _q4_1_weight(96, 128, seed=12)
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    weight_t = weight.t().contiguous()
    half = int4_linear(packed, scale, offset, fp16_dense(weight))
    exact = int4_linear(packed, scale, offset, DenseLinear(weight_t))
    assert half.int4_rows == (INT4_AVX2_MAX_ROWS if code == "AVX2" else INT4_MAX_ROWS)
    assert exact.int4_rows == INT4_MAX_ROWS
    x = torch.randn(INT4_MAX_ROWS + 4, 128)
    expected = x @ weight_t
    got = half.mm(x, decode_rows=decode_rows)
    assert got.dtype == torch.float32
    dense = 0 if decode_rows > half.int4_rows else decode_rows  # rows on the int4 kernel
    assert torch.equal(got[:dense], exact.mm(x, decode_rows=decode_rows)[:dense])
    rounded = x[dense:] @ weight_t.half().float()  # the exact product of the fp16 weights
    torch.testing.assert_close(got[dense:], rounded, rtol=1e-5, atol=1e-5)
    assert 0 < _relative_error(got[dense:], expected[dense:]) < 1e-3
    residual = torch.randn(x.shape[0], 96)
    into = residual.clone()
    half.addmm_(into, x, decode_rows=decode_rows)
    torch.testing.assert_close(into, residual + got)
    padded = 96 * FBGEMM_FP16_BLOCK_ROWS * 2  # 128 inputs padded to one block of fbgemm's
    assert half.nbytes == exact.nbytes - weight.numel() * 4 + padded
    ids = torch.tensor([5, 0, 95])
    assert torch.equal(half.rows(ids), weight[ids].half().float())


@pytest.mark.skipif(not fbgemm_fp16(), reason="fbgemm is x86-only; there the copy is bfloat16 or fp32")
def test_an_fp16_copy_counts_the_blocks_fbgemm_pads_to() -> None:
    """`nbytes` is what the pack holds in memory: SmolLM2's 576 inputs take two blocks."""
    assert fp16_dense(torch.randn(8, 1536)).nbytes == 8 * 1536 * 2
    weight = torch.randn(16384, 576)
    before = _resident_bytes()
    copy = fp16_dense(weight)
    grown = _resident_bytes() - before
    assert copy.nbytes == 16384 * 2 * FBGEMM_FP16_BLOCK_ROWS * 2
    assert 0.9 * copy.nbytes < grown < 1.1 * copy.nbytes  # 1.8x the unpadded 18.9 MB


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("decode_rows", [0, 2, INT4_MAX_ROWS + 1])
def test_rows_on_a_bfloat16_copy_are_close_and_keep_their_dtype(decode_rows: int) -> None:
    """Prompt rows (and all rows of a step past `INT4_MAX_ROWS`) on the bfloat16 copy: within
    bfloat16 rounding of the exact product, returned in float32; the int4 rows are as they were."""
    tensor, weight = _q4_1_weight(96, 128, seed=11)
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    weight_t = weight.t().contiguous()
    half = int4_linear(packed, scale, offset, DenseLinear(weight_t.bfloat16()))
    exact = int4_linear(packed, scale, offset, DenseLinear(weight_t))
    x = torch.randn(INT4_MAX_ROWS + 4, 128)
    expected = x @ weight_t
    got = half.mm(x, decode_rows=decode_rows)
    assert got.dtype == torch.float32
    assert _relative_error(got, expected) < 1e-2
    dense = 0 if decode_rows > INT4_MAX_ROWS else decode_rows  # rows on the int4 kernel
    assert torch.equal(got[:dense], exact.mm(x, decode_rows=decode_rows)[:dense])
    assert not torch.equal(got[dense:], expected[dense:])  # rounded: the copy really is bfloat16
    residual = torch.randn(x.shape[0], 96)
    into = residual.clone()
    half.addmm_(into, x, decode_rows=decode_rows)
    assert into.dtype == torch.float32
    assert _relative_error(into - residual, expected) < 1e-2


def _q8_0_head(rows: int = 64, width: int = 96) -> tuple[torch.Tensor, TokenTable]:
    """A Q8_0 head's exact weights, and the lookup table of its blocks."""
    values = np.random.default_rng(2).standard_normal((rows, width)).astype(np.float32) * 0.05
    qs, scale = _q8_0_parts(_gguf_tensor(values, GGMLQuantizationType.Q8_0))  # type: ignore[arg-type]
    return dequantize_q8_0(qs, scale), TokenTable(q8=(qs, scale))


def test_int8_head_is_close_and_looks_tokens_up_exactly() -> None:
    weight, tokens = _q8_0_head()
    head = int8_head(weight, tokens)
    x = torch.randn(5, 96)
    assert _relative_error(head.mm(x), x @ weight.t()) < 1e-2
    ids = torch.tensor([7, 0, 63])
    assert torch.equal(head.rows(ids), weight[ids])
    with pytest.raises(ValueError, match="token lookups"):
        TokenTable()


@pytest.mark.skipif(not fbgemm_fp16(), reason="fbgemm is x86-only; Int8Head serves there (tested above)")
def test_fp16_head_is_closer_than_int8_and_its_rows_differ_by_the_call_in_last_bits_only() -> None:
    weight, tokens = _q8_0_head()
    head = fp16_head(weight, tokens)
    x = torch.randn(INT4_MAX_ROWS, 96)
    expected = x @ weight.t()
    got = head.mm(x)
    assert got.dtype == torch.float32
    assert _relative_error(got, expected) < 1e-3  # fp16 weights, fp32 rows
    assert _relative_error(got, expected) < _relative_error(int8_head(weight, tokens).mm(x), expected)
    for rows in (1, 2, 7):  # a row's logits depend on what shares the call only in their last bits
        torch.testing.assert_close(head.mm(x[:rows]), got[:rows], rtol=0, atol=1e-5 * float(got.abs().max()))
    residual = torch.randn(INT4_MAX_ROWS, 64)
    into = residual.clone()
    head.addmm_(into, x)
    torch.testing.assert_close(into, residual + got)
    assert head.mm(x.bfloat16()).dtype == torch.bfloat16  # a bfloat16 model's rows come back so
    assert torch.equal(head.rows(torch.tensor([3, 63])), weight[[3, 63]])


@pytest.mark.parametrize("fbgemm", [True, False])
def test_the_head_takes_fbgemm_where_torch_has_it(monkeypatch: pytest.MonkeyPatch, fbgemm: bool) -> None:
    if fbgemm and not fbgemm_fp16():
        pytest.skip("fbgemm is x86-only")
    monkeypatch.setattr(stock_linear, "fbgemm_fp16", lambda: fbgemm)
    weight, tokens = _q8_0_head()
    head = packed_head(weight, tokens)
    assert isinstance(head, Fp16Head if fbgemm else Int8Head)
    x = torch.randn(3, 96)
    assert _relative_error(head.mm(x), x @ weight.t()) < 1e-2


@pytest.fixture(scope="module")
def stock() -> LoadedModel:
    return load_model(STOCK)


@pytest.fixture(scope="module")
def stock_engine(stock: LoadedModel) -> Iterator[LocalEngine]:
    engine = LocalEngine(STOCK, model=stock)
    engine.start_sync()
    yield engine
    engine.close_sync()


@pytest.fixture(scope="module")
def fp16_copy() -> Iterator[tuple[LocalEngine, LoadedModel]]:
    """The engine as a host without native bfloat16 builds it (an AVX2 host): prompt rows, and decode
    steps of more than two rows (`INT4_AVX2_MAX_ROWS`), on the fp16 copy in fbgemm, whatever this
    host has."""
    if not fbgemm_fp16():
        pytest.skip("fbgemm is x86-only: without it there is no fp16 copy (the copy is fp32)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stock_linear, "native_bf16_matmul", lambda: False)
        patch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # its int4 rule
        loaded = load_model(STOCK)
    engine = LocalEngine(STOCK, model=loaded)
    engine.start_sync()
    yield engine, loaded
    engine.close_sync()


@pytest.mark.slow
def test_layers_and_head_take_torchs_packed_kernels(stock: LoadedModel) -> None:
    assert not stock.model.attends_in_kernel
    prompt = prompt_weights("auto", torch.float32)  # the host's fastest dense copy
    for layer in stock.model.layers:
        for linear in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            assert isinstance(linear, Int4Linear)
            if prompt == "float16":
                assert isinstance(linear.dense, Fp16Dense)
            else:
                assert isinstance(linear.dense, DenseLinear)
                want = torch.bfloat16 if prompt == "bfloat16" else torch.float32
                assert linear.dense.weight_t.dtype == want
    assert isinstance(stock.model.lm_head, Fp16Head if fbgemm_fp16() else Int8Head)


@pytest.mark.slow
async def test_chat_still_says_paris(stock_engine: LocalEngine) -> None:
    answer = await stock_engine.complete(chat("What is the capital of France?", temperature=0))
    assert "Paris" in answer.body.decode()


NEAR_TIE = 0.25
"""Widest top-two logprob gap at which a batched greedy answer may leave the single one. The torch
path is not bitwise batch-invariant: decode attention is split by page runs and merged (shared
prefixes, cached pages, gathered rests differ with what shares a step), the flash kernel's result
for a row depends on how many rows share its call, and RoPE differs between decode-only and mixed
steps. Those last-bit differences flip bf16 roundings of the int4 kernel's activations, which moved
a token's logprob by up to 0.12 (measured: `benchmarks/results/engine_quantized.md`); and where the
head is int8 (no fbgemm) its bf16 logits step by 0.125 between 16 and 32, so exact ties are common."""
LOGPROBS = SamplingParams(max_tokens=24, temperature=0.0, logprobs=True, top_logprobs=2)


def _greedy_logprobs(engine: LocalEngine, prompts: list[list[int]]) -> list[list[TokenLogprob]]:
    """Each prompt's chosen tokens with their top two alternatives, all prompts at once."""

    async def one(prompt: list[int]) -> list[TokenLogprob]:
        chosen: list[TokenLogprob] = []
        async for deltas in engine.generate_stream(prompt, LOGPROBS):
            for delta in deltas:
                chosen.extend(delta.logprobs)
        return chosen

    async def go() -> list[list[TokenLogprob]]:
        return list(await asyncio.gather(*(one(p) for p in prompts)))

    return asyncio.run(go())


@pytest.mark.slow
def test_batched_and_mixed_steps_answer_as_single_up_to_near_ties(
    stock_engine: LocalEngine, stock: LoadedModel
) -> None:
    """Four prompts together (decode rows batched, cached prefixes, late prefills beside earlier
    decodes) answer as each alone, or leave that answer only where its top two tokens were within
    `NEAR_TIE` and for the other of the two; until then the logprobs agree to within it."""
    prompts = [
        chat_ids(stock, "What do radix trees store?"),
        stock.tokenizer.encode("Eviction removes"),
        chat_ids(stock, "Name one use."),
        stock.tokenizer.encode("A lookup walks from the root"),
    ]
    alone = [_greedy_logprobs(stock_engine, [p])[0] for p in prompts]
    together = _greedy_logprobs(stock_engine, prompts)
    for single, batched in zip(alone, together, strict=True):
        assert len(single) == LOGPROBS.max_tokens and all(len(t.top) == 2 for t in single)
        same = [a.token_id == b.token_id for a, b in zip(single, batched, strict=False)]
        common = same.index(False) if False in same else len(same)
        for a, b in zip(single[:common], batched[:common], strict=True):
            assert abs(a.logprob - b.logprob) < NEAR_TIE
        if common < len(single):
            (first, best), (second, runner_up) = single[common].top
            assert best - runner_up <= NEAR_TIE
            assert batched[common].token_id in (first, second)


@pytest.mark.slow
async def test_an_fp16_prompt_copy_still_says_paris(fp16_copy: tuple[LocalEngine, LoadedModel]) -> None:
    engine, loaded = fp16_copy
    layer = loaded.model.layers[0]
    assert isinstance(layer.wqkv, Int4Linear) and isinstance(layer.wqkv.dense, Fp16Dense)
    assert layer.wqkv.int4_rows == INT4_AVX2_MAX_ROWS
    answer = await engine.complete(chat("What is the capital of France?", temperature=0))
    assert "Paris" in answer.body.decode()


@pytest.mark.slow
def test_an_fp16_prompt_copy_answers_batched_as_single_up_to_near_ties(
    fp16_copy: tuple[LocalEngine, LoadedModel],
) -> None:
    """Decode steps of more than two rows and prompt rows on the fp16 copy: what shares a step
    changes no answer but at near ties, as with the other copies."""
    test_batched_and_mixed_steps_answer_as_single_up_to_near_ties(*fp16_copy)


def test_decode_weights_is_checked() -> None:
    with pytest.raises(ValueError, match="decode_weights"):
        replace(TEST_CONFIG, decode_weights="int2").validate()  # type: ignore[arg-type]
