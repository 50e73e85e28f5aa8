"""The model's weight matrices: dense (`x @ w_t`), or Q4_1 / Q8_0 packed (through `kernels`).

A decode step reads every weight once for a row or a few, so its products are memory-bound: a
GGUF's Q4_1 layer matrices (the default SmolLM2 file's) are kept packed too, 0.75 bytes per weight
instead of 4, and the kernel multiplies straight from the packed bytes. Up to `FUSED_MAX_ROWS`
rows (decode batches, short chunks) run in the kernel on the same fp32 values `gguf` dequantizes to.

The packed copy is interleaved by 16 outputs (`interleave_q4_1`): one 16-byte load holds two
consecutive inputs' weights of 16 outputs, so the kernel keeps 16 outputs of a row in one register,
unpacks each weight once for up to 16 rows, and needs no horizontal sums. Measured on the 2-core
dev box, the 120 layer products of a SmolLM2 step with the weights streamed from memory: 16 rows
30.6 ms against MKL's 63-68 ms on fp32; one row 8.7-9.8 ms against 12.3-13.5 ms for GGUF's own
block order (the layout before) and 25-30 ms for MKL.

Prompt chunks are compute-bound. With `prefill_activations = "int8"` (the default) the rows of
prompts longer than `EXACT_PROMPT_TOKENS` run in the VNNI kernel on a second packing of the same
nibbles (`interleave_q4_1_vnni`), each row quantized to int8 per block of 32: the 120 layer products
of a 512-row chunk took 367-450 ms against MKL's 984 ms on fp32 (dev box), at ~0.5 % relative
error. Decode rows and short prompts stay in the exact kernel, up to `FUSED_MAX_ROWS` rows a call.
The callers say which rows take int8 (`int8_rows`), decided per sequence, so a row's arithmetic
never depends on what shares its step: a short prompt batched with a long one gets the tokens it
gets alone. With "fp32" chunks of more than `FUSED_MAX_ROWS` rows run in MKL on the dequantized
fp32 copy (130-150 GFLOP/s at best here; the fp32 kernel reaches ~90 at 64 rows), exact.
Only the copy a mode uses is kept: int8 spares the 4-byte copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from adapters.local.config import PrefillActivations
from adapters.local.kernels import CpuKernels

FUSED_MAX_ROWS = 64
"""Most rows one call of the exact packed kernel takes; without `vnni`, a product of more rows runs
in MKL on the fp32 copy (`prefill_activations`). The 120 layer products with weights streamed from
memory, dev box: 32 rows 77 vs 104-114 ms for MKL, 64 rows 148-162 vs 177-215 ms; a chunk of
hundreds of rows runs faster in MKL."""
EXACT_PROMPT_TOKENS = 64
"""Prompts of at most this many tokens stay exact in the int8 mode too: their prefill is short
either way, and a short chat question is where one flipped token shows most (int8 rows turned the
end-to-end test's "What is the capital of France?" away from "Paris")."""
Q4_1_BLOCK = 32
"""Weights per block, in Q4_1 as in Q8_0."""
RowSpans = tuple[tuple[int, int], ...]
"""Sorted, disjoint `[start, stop)` ranges of a product's rows."""
GROUP = 16
"""Outputs interleaved together in the packed layouts (one AVX-512 register of fp32)."""


class Linear(Protocol):
    """`y = x @ w.T` for a weight `w` `[out, in]`, however it is stored."""

    @property
    def nbytes(self) -> int:
        """Bytes the weight holds in memory."""
        ...

    def mm(self, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0) -> torch.Tensor:
        """`x @ w.T` for `x` `[rows, in]`: a new `[rows, out]` tensor. `int8_rows`: the rows that may
        take int8 activations (see `Q4Linear`); `decode_rows`: the first rows are decode rows, which
        may take torch's packed-weight kernels (see `stock_linear`); the rest are exact."""
        ...

    def addmm_(
        self, out: torch.Tensor, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0
    ) -> None:
        """`out += x @ w.T`, in place (the residual adds)."""
        ...

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of `w` (`[len(ids), in]`): the embeddings of a tied head."""
        ...


@dataclass(slots=True)
class DenseLinear:
    """A dense weight, stored transposed (`[in, out]`, see `gguf_convert._t`). In the model's dtype,
    or bfloat16 for torch's packed path's prompt rows (`stock_linear.prompt_weights`): then
    the rows multiply as bfloat16 and come back in their own dtype."""

    weight_t: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.weight_t.numel() * self.weight_t.element_size()

    def mm(self, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0) -> torch.Tensor:
        if x.dtype != self.weight_t.dtype:
            return (x.to(self.weight_t.dtype) @ self.weight_t).to(x.dtype)
        return x @ self.weight_t

    def addmm_(
        self, out: torch.Tensor, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0
    ) -> None:
        if x.dtype != self.weight_t.dtype:
            out.add_(x.to(self.weight_t.dtype) @ self.weight_t)
            return
        out.addmm_(x, self.weight_t)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight_t.index_select(1, ids).t().contiguous()


@dataclass(slots=True)
class Q4Linear:
    """A Q4_1 weight `[out, in]` kept packed (`interleave_q4_1`: `packed` `[out/16, in/2, 16]` bytes,
    `scale` and `offset` `[out/16, in/32, 16]` fp32) for exact products (up to `FUSED_MAX_ROWS`
    rows a call), and exactly one of: `vnni` (`interleave_q4_1_vnni`): prompt rows with int8
    activations; or `weight_t` (fp32 `[in, out]`): products of more rows in MKL, exact."""

    packed: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    kernel: CpuKernels
    weight_t: torch.Tensor | None = None
    vnni: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        parts = (self.packed, self.scale, self.offset, self.weight_t, self.vnni)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def mm(self, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0) -> torch.Tensor:
        if x.shape[0] > FUSED_MAX_ROWS and self.weight_t is not None:
            return x @ self.weight_t
        out = torch.empty(x.shape[0], self.packed.shape[0] * GROUP, dtype=torch.float32)
        self._product(x, out, accumulate=False, int8_rows=int8_rows)
        return out

    def addmm_(
        self, out: torch.Tensor, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0
    ) -> None:
        if x.shape[0] > FUSED_MAX_ROWS and self.weight_t is not None:
            out.addmm_(x, self.weight_t)
        elif out.stride(-1) != 1:
            out.add_(self.mm(x, int8_rows))
        else:
            self._product(x, out, accumulate=True, int8_rows=int8_rows)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        group, lane = ids // GROUP, ids % GROUP  # output n is lane n % 16 of group n // 16
        pairs = self.packed[group, :, lane]  # [ids, in/2]: inputs 2p (low nibble) and 2p + 1
        q = torch.stack([pairs & 15, pairs >> 4], dim=-1).view(len(ids), -1).to(torch.float32)
        scale = self.scale[group, :, lane].repeat_interleave(Q4_1_BLOCK, dim=1)
        offset = self.offset[group, :, lane].repeat_interleave(Q4_1_BLOCK, dim=1)
        return q * scale + offset  # as `gguf` computes it (no fused multiply-add)

    def _product(self, x: torch.Tensor, out: torch.Tensor, *, accumulate: bool, int8_rows: RowSpans) -> None:
        """`int8_rows` with int8 activations where `vnni` is kept; every other row in the exact
        kernel, up to `FUSED_MAX_ROWS` at a time."""
        rows = _rows_contiguous(x)
        total = rows.shape[0]
        spans = int8_rows if self.vnni is not None else ()
        done = 0
        for start, stop in (*spans, (total, total)):
            for first in range(done, start, FUSED_MAX_ROWS):
                part = slice(first, min(start, first + FUSED_MAX_ROWS))
                self.kernel.matmul(
                    rows[part], self.packed, self.scale, self.offset, out[part], accumulate=accumulate
                )
            if self.vnni is not None and stop > start:
                self.kernel.matmul_int8(
                    rows[start:stop],
                    self.vnni,
                    self.scale,
                    self.offset,
                    out[start:stop],
                    accumulate=accumulate,
                )
            done = stop


def clip_spans(spans: RowSpans, start: int, stop: int) -> RowSpans:
    """The part of `spans` within rows `[start, stop)`, counted from `start`."""
    return tuple((max(a, start) - start, min(b, stop) - start) for a, b in spans if a < stop and b > start)


def merged_spans(spans: list[tuple[int, int]]) -> RowSpans:
    """Sorted `spans` with touching ones joined (one kernel call instead of several)."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted(spans):
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        elif stop > start:
            out.append((start, stop))
    return tuple(out)


@dataclass(slots=True)
class Q8Linear:
    """A Q8_0 weight `[out, in]` kept packed only (`interleave_q8_0`: `packed` `[out/16, in, 16]`
    int8, `scale` `[out/16, in/32, 16]` fp32). GGUF files often store the embedding table so; tied
    to the head, it is the step's biggest matrix (SmolLM2: 49,152 x 576, 113 MB in fp32, 32 MB
    packed). Every product runs through the kernel: the head multiplies only the rows that give
    logits, one per decoding sequence and finished prompt."""

    packed: torch.Tensor
    scale: torch.Tensor
    kernel: CpuKernels

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scale))

    def mm(self, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0) -> torch.Tensor:
        return self.kernel.q8_matmul(_rows_contiguous(x), self.packed, self.scale)

    def addmm_(
        self, out: torch.Tensor, x: torch.Tensor, int8_rows: RowSpans = (), decode_rows: int = 0
    ) -> None:
        out.add_(self.mm(x))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        group, lane = ids // GROUP, ids % GROUP  # output n is lane n % 16 of group n // 16
        return dequantize_q8_0(self.packed[group, :, lane], self.scale[group, :, lane])


def interleave_q4_1(
    qs: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF's Q4_1 parts (`qs` `[out, in/2]`: block b of a row at bytes 16b..16b+15, byte j holding
    element j in its low nibble and j + 16 in its high one; `scale`, `offset` `[out, in/32]`) in the
    kernel's layout: `[out/16, in/2, 16]` bytes, byte j of pair p of group g holding inputs 2p (low
    nibble) and 2p + 1 (high) of output 16g + j; scale and offset `[out/16, in/32, 16]`."""
    rows, blocks = scale.shape
    halves = qs.view(rows, blocks, Q4_1_BLOCK // 2)
    values = torch.cat([halves & 15, halves >> 4], dim=-1).view(
        rows // GROUP, GROUP, blocks * Q4_1_BLOCK // 2, 2
    )
    pairs = values[..., 0] | (values[..., 1] << 4)
    return pairs.transpose(1, 2).contiguous(), _by_group(scale), _by_group(offset)


def interleave_q4_1_vnni(packed: torch.Tensor) -> torch.Tensor:
    """`interleave_q4_1`'s bytes regrouped for the VNNI kernel: `[out/16, in/8, 16, 4]`, byte t of
    output j in chunk c of a group holding input 8c + t (low nibble) and 8c + 4 + t (high), so one
    64-byte load unpacks (a mask, a shift) into 4 consecutive inputs of 16 outputs twice."""
    groups, pairs, _ = packed.shape
    values = torch.stack([packed & 15, packed >> 4], dim=2).view(groups, pairs * 2 // 8, 2, 4, GROUP)
    return (values[:, :, 0] | (values[:, :, 1] << 4)).permute(0, 1, 3, 2).contiguous()


def interleave_q8_0(qs: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF's Q8_0 parts (`qs` `[out, in]` int8, `scale` `[out, in/32]`) in the kernel's layout:
    `[out/16, in, 16]` int8 and `[out/16, in/32, 16]`."""
    rows, cols = qs.shape
    return qs.view(rows // GROUP, GROUP, cols).transpose(1, 2).contiguous(), _by_group(scale)


def by_output(grouped: torch.Tensor) -> torch.Tensor:
    """An interleaved `[out/16, n, 16]` tensor back in rows of outputs, `[out, n]`."""
    groups, width, _ = grouped.shape
    return grouped.transpose(1, 2).reshape(groups * GROUP, width)


def _by_group(per_block: torch.Tensor) -> torch.Tensor:
    rows, blocks = per_block.shape
    return per_block.view(rows // GROUP, GROUP, blocks).transpose(1, 2).contiguous()


def dequantize_q8_0(qs: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The `[out, in]` fp32 weights of a packed Q8_0 matrix (`d * q`, as `gguf` computes them)."""
    rows, blocks = scale.shape
    q = qs.view(rows, blocks, Q4_1_BLOCK).to(torch.float32)
    return (q * scale.unsqueeze(-1)).view(rows, blocks * Q4_1_BLOCK)


def dequantize_q4_1(qs: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The `[out, in]` fp32 weights of a packed Q4_1 matrix, computed as `gguf` does (`d * q + m`,
    no fused multiply-add), so the values are bit-identical to its dequantization."""
    rows, blocks = scale.shape
    packed = qs.view(rows, blocks, Q4_1_BLOCK // 2)
    q = torch.cat([packed & 15, packed >> 4], dim=-1).to(torch.float32)
    return (q * scale.unsqueeze(-1) + offset.unsqueeze(-1)).view(rows, blocks * Q4_1_BLOCK)


def build_linear(
    tensors: dict[str, torch.Tensor],
    name: str,
    dtype: torch.dtype,
    kernel: CpuKernels | None,
    prefill_activations: PrefillActivations = "fp32",
    *,
    copy: bool = False,
) -> Linear:
    """The weight `name` from a checkpoint (see `gguf_convert`): dense in `dtype` (`{name}_t`), or
    its interleaved Q4_1 packing (`{name}.packed/.scale/.offset`) when the checkpoint has it and the
    kernels run in this dtype, with the dense copy for long chunks unless `prefill_activations` is
    "int8" and the CPU has VNNI; an interleaved Q8_0 matrix (`{name}.packed/.scale`, no dense copy)
    packed, or unpacked where the kernels do not run. `copy`: every tensor kept is a copy, none a
    view of `tensors` (see `owned`)."""
    take = kept(copy)
    if f"{name}.packed" not in tensors:
        return DenseLinear(take(tensors[f"{name}_t"].to(dtype)))
    packed, scale = take(tensors[f"{name}.packed"]), take(tensors[f"{name}.scale"])
    runs = kernel if dtype == torch.float32 else None  # the kernels take fp32 activations only
    if f"{name}.offset" not in tensors:  # Q8_0
        if runs is not None:
            return Q8Linear(packed=packed, scale=scale, kernel=runs)
        weight = dequantize_q8_0(by_output(packed), by_output(scale))
        return DenseLinear(weight.t().to(dtype).contiguous())
    if runs is None:
        return DenseLinear(take(tensors[f"{name}_t"].to(dtype)))
    offset = take(tensors[f"{name}.offset"])
    if prefill_activations == "int8" and runs.vnni:
        vnni = interleave_q4_1_vnni(packed)
        return Q4Linear(packed=packed, scale=scale, offset=offset, kernel=runs, vnni=vnni)
    weight_t = take(tensors[f"{name}_t"].to(dtype))
    return Q4Linear(packed=packed, scale=scale, offset=offset, kernel=runs, weight_t=weight_t)


def owned(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `tensor` in memory of its own. A checkpoint's tensors are views of one
    mapping of its file: while any view lives, every page of the file ever touched stays resident,
    and each fault maps its neighbours too. A model that keeps only part of the file (int8 prefill
    leaves the fp32 copies unread) copies what it keeps, so the mapping goes with the checkpoint
    and its resident memory is what it holds (measured ~9 MB less at run time than views)."""
    return tensor.clone(memory_format=torch.contiguous_format)


def kept(copy: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a model keeps a checkpoint's tensor: `owned` (a copy) when `copy`, else contiguous (a view
    of the checkpoint where it already is)."""
    return owned if copy else _contiguous


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous()


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 and x.dtype == torch.float32 else x.to(torch.float32).contiguous()
