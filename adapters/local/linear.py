"""The model's weight matrices: dense (`x @ w_t`), or Q4_1 / Q8_0 packed (through `kernels`).

A decode step reads every weight once for a row or a few, so its products are memory-bound: a
GGUF's Q4_1 layer matrices (the default SmolLM2 file's) are kept packed too, 0.75 bytes per weight
instead of 4, and the kernel multiplies straight from the packed bytes. Up to `FUSED_MAX_ROWS`
rows (decode batches, short chunks) run in the kernel; longer prefill chunks are compute-bound
and run by MKL on the unpacked fp32 copy. Both hold the same fp32 values `gguf` dequantizes to.

The packed copy is interleaved by 16 outputs (`interleave_q4_1`): one 16-byte load holds two
consecutive inputs' weights of 16 outputs, so the kernel keeps 16 outputs of a row in one register,
unpacks each weight once for up to 16 rows, and needs no horizontal sums. Measured on the 2-core
dev box, the 120 layer products of a SmolLM2 step with the weights streamed from memory: 16 rows
30.6 ms against MKL's 63-68 ms on fp32; one row 8.7-9.8 ms against 12.3-13.5 ms for GGUF's own
block order (the layout before) and 25-30 ms for MKL.

Decision: both copies of a Q4_1 matrix stay resident. Prefill chunks of hundreds of rows run at
MKL's compute peak (130-150 GFLOP/s here), which the kernel does not reach (~90 at 64 rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from adapters.local.kernels import CpuKernels

FUSED_MAX_ROWS = 64
"""Most rows a Q4_1 product runs through the packed kernel; more run by MKL on the fp32 copy. The
120 layer products with weights streamed from memory, dev box: 32 rows 77 vs 104-114 ms for MKL,
64 rows 148-162 vs 177-215 ms; a chunk of hundreds of rows runs faster in MKL."""
Q4_1_BLOCK = 32
"""Weights per block, in Q4_1 as in Q8_0."""
GROUP = 16
"""Outputs interleaved together in the packed layouts (one AVX-512 register of fp32)."""


class Linear(Protocol):
    """`y = x @ w.T` for a weight `w` `[out, in]`, however it is stored."""

    @property
    def nbytes(self) -> int:
        """Bytes the weight holds in memory."""
        ...

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ w.T` for `x` `[rows, in]`: a new `[rows, out]` tensor."""
        ...

    def addmm_(self, out: torch.Tensor, x: torch.Tensor) -> None:
        """`out += x @ w.T`, in place (the residual adds of a decode step)."""
        ...

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of `w` (`[len(ids), in]`): the embeddings of a tied head."""
        ...


@dataclass(slots=True)
class DenseLinear:
    """A dense weight, stored transposed (`[in, out]`, see `gguf_convert._t`)."""

    weight_t: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.weight_t.numel() * self.weight_t.element_size()

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight_t

    def addmm_(self, out: torch.Tensor, x: torch.Tensor) -> None:
        out.addmm_(x, self.weight_t)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight_t.index_select(1, ids).t().contiguous()


@dataclass(slots=True)
class Q4Linear:
    """A Q4_1 weight `[out, in]` kept packed (`interleave_q4_1`: `packed` `[out/16, in/2, 16]` bytes,
    `scale` and `offset` `[out/16, in/32, 16]` fp32) for products of up to `FUSED_MAX_ROWS` rows;
    and unpacked (`weight_t`, fp32 `[in, out]`) for longer ones, which MKL runs at its compute peak."""

    packed: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    weight_t: torch.Tensor
    kernel: CpuKernels

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (self.packed, self.scale, self.offset, self.weight_t)
        )

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > FUSED_MAX_ROWS:
            return x @ self.weight_t
        out = torch.empty(x.shape[0], self.weight_t.shape[1], dtype=torch.float32)
        self.kernel.matmul(_rows_contiguous(x), self.packed, self.scale, self.offset, out, accumulate=False)
        return out

    def addmm_(self, out: torch.Tensor, x: torch.Tensor) -> None:
        if x.shape[0] > FUSED_MAX_ROWS or out.stride(-1) != 1:
            out.addmm_(x, self.weight_t)
            return
        self.kernel.matmul(_rows_contiguous(x), self.packed, self.scale, self.offset, out, accumulate=True)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight_t.index_select(1, ids).t().contiguous()


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

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel.q8_matmul(_rows_contiguous(x), self.packed, self.scale)

    def addmm_(self, out: torch.Tensor, x: torch.Tensor) -> None:
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


def interleave_q8_0(qs: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF's Q8_0 parts (`qs` `[out, in]` int8, `scale` `[out, in/32]`) in the kernel's layout:
    `[out/16, in, 16]` int8 and `[out/16, in/32, 16]`."""
    rows, cols = qs.shape
    return qs.view(rows // GROUP, GROUP, cols).transpose(1, 2).contiguous(), _by_group(scale)


def _by_output(grouped: torch.Tensor) -> torch.Tensor:
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
    tensors: dict[str, torch.Tensor], name: str, dtype: torch.dtype, kernel: CpuKernels | None
) -> Linear:
    """The weight `name` from a checkpoint (see `gguf_convert`): dense in `dtype` (`{name}_t`), with
    its interleaved Q4_1 packing (`{name}.packed/.scale/.offset`) when the checkpoint has it and the
    kernels run in this dtype; an interleaved Q8_0 matrix (`{name}.packed/.scale`, no dense copy)
    packed, or unpacked where the kernels do not run."""
    if f"{name}.packed" not in tensors:
        return DenseLinear(tensors[f"{name}_t"].to(dtype).contiguous())
    packed, scale = tensors[f"{name}.packed"].contiguous(), tensors[f"{name}.scale"].contiguous()
    runs = kernel if dtype == torch.float32 else None  # the kernels take fp32 activations only
    if f"{name}.offset" not in tensors:  # Q8_0
        if runs is not None:
            return Q8Linear(packed=packed, scale=scale, kernel=runs)
        weight = dequantize_q8_0(_by_output(packed), _by_output(scale))
        return DenseLinear(weight.t().to(dtype).contiguous())
    weight_t = tensors[f"{name}_t"].to(dtype).contiguous()
    if runs is not None:
        offset = tensors[f"{name}.offset"].contiguous()
        return Q4Linear(packed=packed, scale=scale, offset=offset, weight_t=weight_t, kernel=runs)
    return DenseLinear(weight_t)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 and x.dtype == torch.float32 else x.to(torch.float32).contiguous()
