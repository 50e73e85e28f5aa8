"""Decode rows on packed weights through torch's own CPU kernels: the path of every host where the
C kernels (`kernels`, AVX-512 only) do not run.

A decode step is memory-bound: it reads every weight once for a row or a few. Dense fp32 weights
are 4 bytes each (the default SmolLM2 file's 120 layer matrices: 425 MB a step); the GGUF's Q4_1
nibbles are half a byte. torch ships weight-only kernels for both formats used here, with AVX2,
AVX-512 and NEON code chosen at run time (`torch.backends.cpu.get_cpu_capability()`):

- `_weight_int4pack_mm_for_cpu` (groups of 32 inputs, as Q4_1's blocks) for the layer matrices:
  Q4_1's `d * q + m` is its `(q - 8) * scale + zero` with `zero = m + 8 d`, so the nibbles go in
  as they are and only `d` and `zero` are rounded (to bf16, the type its vector code takes).
- for the Q8_0 head (it multiplies only the rows that give logits), fbgemm's fp16 GEMM where torch
  has fbgemm (x86: `fbgemm_fp16`), fp32 rows in and out; elsewhere `_weight_int8pack_mm` (int8 per
  output channel), whose 28 MB read faster than 113 MB of fp32.

The int4 and int8 kernels take bf16 activations and give bf16 outputs (their fp32 paths are scalar
code on x86). Measured in `benchmarks/results/engine_quantized.md` (`python -m
benchmarks.engine.products`): one row's 120 layer products with torch's AVX2 code in 8.8 ms against
19.5 for MKL on fp32. Prompt chunks are compute-bound, and there these kernels lose to a dense
product (512 rows: 0.7-4.4 s against 0.4-0.6 for MKL on fp32), so prompt rows, and the decode rows
of a step with more than `int4_max_rows` of them (16; 2 with AVX2 code beside the fp16 copy, which
then wins from three rows), multiply a dense copy of the weights, the fastest
this host has (`prompt_weights`): bfloat16 in oneDNN where the CPU multiplies bfloat16 natively
(512 rows 339-358 ms against 758-816 for MKL on fp32 on an AMD Zen 4); else fp16 weights in fbgemm's
fp16 GEMM with fp32 rows where torch has fbgemm (x86 without native bfloat16: AVX2 hosts, the first
AVX-512 ones); else fp32 in MKL, exact. The bfloat16 copy takes half the fp32 copy's memory, the
fp16 one 79 % of it (fbgemm pads, `FBGEMM_FP16_BLOCK_ROWS`). Which rows are
which the caller says (`decode_rows`: a step's decode rows come first), so up to that many a row's
arithmetic depends on its own request, never on what shares its step.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

import torch

from adapters.local.config import PrefillActivations
from adapters.local.linear import (
    GROUP,
    Q4_1_BLOCK,
    DenseLinear,
    Linear,
    RowSpans,
    by_output,
    dequantize_q8_0,
    kept,
    owned,
)
from adapters.local.matmul_attention import native_bf16_matmul

INT4_MAX_ROWS = 16
"""Most decode rows a product takes through the int4 kernel (but `INT4_AVX2_MAX_ROWS`, see
`int4_max_rows`); a step with more (a full batch, speculative verification rows) multiplies them all
on the dense copy, where fp32 in MKL wins with AVX2 and AVX-512 code alike (32 and 64 rows,
`benchmarks/results/engine_quantized.md`), and so do bfloat16 in oneDNN and fp16 in fbgemm (64
rows). Up to this many, a row's result does not depend on the rows beside it. It is also the most
decode rows a step takes on torch's packed path (`LlamaModel.decode_row_limit`), so the room
speculative drafts have."""
INT4_AVX2_MAX_ROWS = 2
"""The same where torch's int4 kernel runs its AVX2 code and the dense copy is fp16 in fbgemm (x86
hosts without AVX-512: most laptops). That kernel's time grows with the rows almost as if each row
read the weights again, fbgemm's hardly does: 120 layer products on an AMD EPYC Zen 3 (2026-12-04,
`benchmarks.engine.products --no-c --rows 1 2 3 4 8 16 --only int4pack fp16`), int4 13.2 / 17.0 /
19.5 / 23.4 / 43.3 / 83.9 ms against fp16 17.2 / 18.8 / 18.4 / 18.9 / 25.7 / 42.1. So one and two
rows stay int4 (a single stream's plain decode step), three or more (verification rows, batches)
take the fp16 copy. A row's tokens may then depend on how many rows share its step at near ties
only, as on the rest of this path (bf16 activations; `test_stock_linear`'s near-tie rule); exactness
is the fp32 mode's promise."""
INT4_INNER_K_TILES = 1
"""`_convert_weight_to_int4pack_for_cpu`'s tiling argument (the CPU kernel's own layout)."""
_ACTIVATIONS = torch.bfloat16


PromptWeights = Literal["model", "bfloat16", "float16"]
"""The dense copy torch's packed path multiplies prompt rows with: the model's dtype; bfloat16 in
oneDNN; or fp16 weights packed for fbgemm's fp16 GEMM (`Fp16Dense`, fp32 rows in and out)."""


def prompt_weights(prefill_activations: PrefillActivations, dtype: torch.dtype) -> PromptWeights:
    """The dense copy for prompt rows: for "auto" in a float32 model the fastest this host has,
    bfloat16 where oneDNN multiplies it natively (AVX512-BF16, AMX, ARM's bf16 dot products:
    `native_bf16_matmul`), else fp16 where torch has fbgemm (`fbgemm_fp16`), else the model's
    dtype (emulated bfloat16 is slower than fp32 in MKL; "fp32" asks for exact prompt products)."""
    if prefill_activations != "auto" or dtype != torch.float32:
        return "model"
    if native_bf16_matmul():
        return "bfloat16"
    return "float16" if fbgemm_fp16() else "model"


@dataclass(slots=True)
class Int4Linear:
    """A Q4_1 weight `[out, in]` as torch's int4 pack (`packed` `[out, in/2]` uint8,
    `scales_zeros` `[in/32, out, 2]` bf16) for decode rows, and `dense` (the dense copy, see
    `prompt_weights`) for the rest."""

    packed: torch.Tensor
    scales_zeros: torch.Tensor
    dense: DenseLinear | Fp16Dense
    int4_rows: int = INT4_MAX_ROWS
    """Most decode rows a product takes through the int4 kernel (`int4_max_rows`); more: all on `dense`."""

    @property
    def nbytes(self) -> int:
        parts = (self.packed, self.scales_zeros)
        return sum(t.numel() * t.element_size() for t in parts) + self.dense.nbytes

    def mm(self, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0) -> torch.Tensor:
        if decode_rows == 0 or decode_rows > self.int4_rows:
            return self.dense.mm(x)
        compact = self._compact(x[:decode_rows])
        if decode_rows == x.shape[0]:
            return compact
        return torch.cat([compact, self.dense.mm(x[decode_rows:])])

    def addmm_(
        self, out: torch.Tensor, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0
    ) -> None:
        if decode_rows > self.int4_rows:
            decode_rows = 0  # all rows on the dense copy, in one call
        if decode_rows:
            out[:decode_rows].add_(self._compact(x[:decode_rows]))
        if decode_rows < x.shape[0]:
            self.dense.addmm_(out[decode_rows:], x[decode_rows:])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dense.rows(ids)

    def _compact(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(_ACTIVATIONS).contiguous(), self.packed, Q4_1_BLOCK, self.scales_zeros
        )
        return y.to(x.dtype)


FBGEMM_FP16_BLOCK_ROWS = 512
"""fbgemm's fp16 pack cuts the inputs into blocks of this many (its default block row size, which
torch's prepack keeps) and pads the last: SmolLM2's 576-wide matrices take 1,024 columns, 1.8x
their fp16 size (measured by resident memory per pack, 2026-12-03)."""


@dataclass(slots=True)
class Fp16Dense:
    """A weight `[out, in]` (`shape`) as fp16 packed for fbgemm's fp16 GEMM (`packed`), which widens
    it to fp32 as it multiplies: fp32 rows in and out, each weight rounded to fp16 once (2^-11
    relative, against bfloat16's 2^-8). Where torch has fbgemm but the CPU no native bfloat16 it is
    the fastest dense product measured on an AMD Zen 3 with AVX2: 120 layer products of 64 rows 108
    ms against 187 for MKL on fp32, 512 rows 683 against 736. On an Intel Xeon running AVX2 code MKL
    does better (fbgemm's times are the same): fp16 wins at 16 and 64 rows (43 against 62, 104
    against 112) and loses at 512 (685 against 604; cold prefill 2-13 % slower), with 79 % of the
    fp32 copy's memory (`benchmarks/results/engine_quantized.md`). A row's result does not depend on
    the rows beside it but for a few fp32 ulps (fbgemm's AVX2 code blocks rows by how many there
    are)."""

    packed: torch.ScriptObject
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        """What fbgemm holds: the inputs padded to whole blocks of `FBGEMM_FP16_BLOCK_ROWS`."""
        out, inputs = self.shape
        return out * -(-inputs // FBGEMM_FP16_BLOCK_ROWS) * FBGEMM_FP16_BLOCK_ROWS * 2

    def mm(self, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0) -> torch.Tensor:
        rows = x.to(torch.float32).contiguous()
        y: torch.Tensor = torch.ops.quantized.linear_dynamic_fp16(rows, self.packed)
        return y.to(x.dtype)

    def addmm_(
        self, out: torch.Tensor, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0
    ) -> None:
        out.add_(self.mm(x))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the weight as fp32 (its fp16 values): fbgemm's pack unpacked."""
        weight: torch.Tensor = torch.ops.quantized.linear_unpack_fp16(self.packed)[0]
        return weight.index_select(0, ids)


def fp16_dense(weight: torch.Tensor) -> Fp16Dense:
    """`Fp16Dense` of the `[out, in]` `weight` (fbgemm copies it into its own layout)."""
    packed = torch.ops.quantized.linear_prepack_fp16(weight.to(torch.float32).contiguous(), None)
    return Fp16Dense(packed=packed, shape=(weight.shape[0], weight.shape[1]))


@dataclass(slots=True, frozen=True)
class TokenTable:
    """Token lookups of a tied embedding whose head multiplies in a packed form: the exact weight
    (`table`), or the Q8_0 blocks (`q8`, `[vocab, hidden]` int8 and `[vocab, hidden/32]` fp32
    scales) it came from, dequantized as `gguf` does."""

    table: Linear | None = None
    q8: tuple[torch.Tensor, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.table is None and self.q8 is None:
            raise ValueError("a head needs the exact weight or its Q8_0 blocks for token lookups")

    @property
    def nbytes(self) -> int:
        parts = self.q8 or ()
        table = self.table.nbytes if self.table is not None else 0
        return int(sum(t.numel() * t.element_size() for t in parts)) + table

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        if self.q8 is not None:
            qs, scale = self.q8
            return dequantize_q8_0(qs[ids], scale[ids])
        assert self.table is not None  # `__post_init__`
        return self.table.rows(ids)


@dataclass(slots=True)
class _PackedHead(ABC):
    """What the packed heads share: token lookups, and the residual add of their product."""

    tokens: TokenTable

    @abstractmethod
    def mm(self, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0) -> torch.Tensor:
        """The logits of rows `x`, in `x`'s dtype."""

    def addmm_(
        self, out: torch.Tensor, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0
    ) -> None:
        out.add_(self.mm(x))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens.rows(ids)


@dataclass(slots=True)
class Int8Head(_PackedHead):
    """The head `[vocab, hidden]` as int8 per output channel (`weight` int8, `scales` `[vocab]`
    bf16) for every row it multiplies (only rows that give logits reach it): where torch has no
    fbgemm (`fbgemm_fp16`)."""

    weight: torch.Tensor
    scales: torch.Tensor

    @property
    def nbytes(self) -> int:
        parts = (self.weight, self.scales)
        return int(sum(t.numel() * t.element_size() for t in parts)) + self.tokens.nbytes

    def mm(self, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0) -> torch.Tensor:
        y: torch.Tensor = torch.ops.aten._weight_int8pack_mm(
            x.to(_ACTIVATIONS).contiguous(), self.weight, self.scales
        )
        return y.to(x.dtype)


@dataclass(slots=True)
class Fp16Head(_PackedHead):
    """The head `[vocab, hidden]` as `Fp16Dense` (`matrix`). Faster than `Int8Head` at every row
    count measured, and closer to the exact product (no bf16 rounding of activations or logits; 2e-4
    relative error against int8's 3e-3): one row 1.9 ms against 2.4 with AVX-512 code (2.0 against
    3.3 with AVX2 code), 16 rows 6.4 against 12.4 (7.2 against 15.4), streamed from memory on an AMD
    Zen 4 (`benchmarks/results/engine_quantized.md`). A row's logits do not depend on the rows
    beside it but for a few fp32 ulps: bitwise equal with fbgemm's AVX-512 code, within 3.6e-6 of
    logits up to 6 with its AVX2 code (tested; `Int8Head` rounds logits to bf16, steps of 0.125
    between 16 and 32)."""

    matrix: Fp16Dense

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes + self.tokens.nbytes

    def mm(self, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0) -> torch.Tensor:
        return self.matrix.mm(x)


@functools.cache
def fbgemm_fp16() -> bool:
    """Whether this torch multiplies by fbgemm's fp16 GEMM: x86 builds have fbgemm, ARM's do not
    (there the op raises, and the head takes `Int8Head`)."""
    # A build without fbgemm has no kernel for these ops: torch's dispatcher says so by raising
    # NotImplementedError (RuntimeError or AttributeError from older builds).
    try:
        packed = torch.ops.quantized.linear_prepack_fp16(torch.zeros(GROUP, GROUP), None)
        torch.ops.quantized.linear_dynamic_fp16(torch.zeros(1, GROUP), packed)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return True


def int4_max_rows(dense: DenseLinear | Fp16Dense, capability: str) -> int:
    """Most decode rows of a product the int4 kernel takes beside `dense`, where torch runs its
    `capability` code (`torch.backends.cpu.get_cpu_capability()`): `INT4_AVX2_MAX_ROWS` for AVX2
    code beside an fp16 copy, else `INT4_MAX_ROWS`."""
    if capability == "AVX2" and isinstance(dense, Fp16Dense):
        return INT4_AVX2_MAX_ROWS
    return INT4_MAX_ROWS


def int4_linear(
    packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, dense: DenseLinear | Fp16Dense
) -> Int4Linear:
    """`Int4Linear` from a Q4_1 weight in the C kernels' layout (`linear.interleave_q4_1`:
    `packed` `[out/16, in/2, 16]`, `scale`, `offset` `[out/16, in/32, 16]`), taking as many decode
    rows through the int4 kernel as `int4_max_rows` says for this host."""
    groups, pairs, _ = packed.shape
    nibbles = torch.stack([packed & 15, packed >> 4], dim=-1)  # [g, in/2, 16, 2]: inputs 2p, 2p + 1
    q = nibbles.permute(0, 2, 1, 3).reshape(groups * GROUP, pairs * 2)
    torch_packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), INT4_INNER_K_TILES)
    by_input = scale.permute(1, 0, 2).reshape(scale.shape[1], -1)  # [in/32, out]
    zero = offset.permute(1, 0, 2).reshape(offset.shape[1], -1) + 8 * by_input
    scales_zeros = torch.stack([by_input, zero], dim=-1).to(_ACTIVATIONS).contiguous()
    rows = int4_max_rows(dense, torch.backends.cpu.get_cpu_capability())
    return Int4Linear(packed=torch_packed, scales_zeros=scales_zeros, dense=dense, int4_rows=rows)


def int8_head(weight: torch.Tensor, tokens: TokenTable) -> Int8Head:
    """`Int8Head` of the `[vocab, hidden]` fp32 `weight`: each output's int8 values scaled by its
    max |w| / 127."""
    scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
    quantized = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Head(weight=owned(quantized), scales=scale.to(_ACTIVATIONS), tokens=tokens)


def fp16_head(weight: torch.Tensor, tokens: TokenTable) -> Fp16Head:
    """`Fp16Head` of the `[vocab, hidden]` fp32 `weight`."""
    return Fp16Head(matrix=fp16_dense(weight), tokens=tokens)


def packed_head(weight: torch.Tensor, tokens: TokenTable) -> Int8Head | Fp16Head:
    """The head for this host: `Fp16Head` where torch has fbgemm, else `Int8Head`."""
    return fp16_head(weight, tokens) if fbgemm_fp16() else int8_head(weight, tokens)


def build_stock_linear(
    tensors: dict[str, torch.Tensor],
    name: str,
    dtype: torch.dtype,
    *,
    copy: bool = False,
    prompt: PromptWeights = "model",
) -> Linear:
    """The weight `name` from a checkpoint (see `gguf_convert`) for a model the C kernels do not run:
    a Q4_1 layer matrix as `Int4Linear` (its dense copy as `prompt` says), a Q8_0 head as
    `packed_head` chooses, anything else dense. `copy`: the dense weights are copies (`owned`), not
    views of the checkpoint."""

    def dense(kind: PromptWeights) -> DenseLinear | Fp16Dense:
        weight_t = tensors[f"{name}_t"]
        if kind == "float16":
            return fp16_dense(weight_t.t())
        return DenseLinear(kept(copy)(weight_t.to(torch.bfloat16 if kind == "bfloat16" else dtype)))

    if f"{name}.packed" not in tensors:
        return dense("model")
    packed, scale = tensors[f"{name}.packed"], tensors[f"{name}.scale"]
    if f"{name}.offset" in tensors:
        return int4_linear(packed, scale, tensors[f"{name}.offset"], dense(prompt))
    qs, q8_scale = by_output(packed), by_output(scale)
    return packed_head(dequantize_q8_0(qs, q8_scale), TokenTable(q8=(qs, q8_scale)))
