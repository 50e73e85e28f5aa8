"""The model's weight matrices: dense (`x @ w_t`), or Q4_1 / Q8_0 packed (through `kernels`).

A decode step of one stream (or a few) reads every weight once for a row or a few, so its products
are memory-bound: a GGUF's Q4_1 layer matrices (the default SmolLM2 file's) are kept packed too,
0.75 bytes per weight instead of 4, and the kernel multiplies straight from the packed bytes (the
120 layer products of a SmolLM2 decode step: 10.6 against 27.3 ms fp32 on the 2-core dev box).
Products of many rows (prefill chunks, big decode batches) are compute-bound and run by MKL on the
unpacked fp32 copy. Both hold the same fp32 values `gguf` dequantizes to.

Decision: both copies of a Q4_1 matrix stay resident. Unpacking on the fly for each many-row step
was measured: ~50 ms of a 16-stream decode step at 300 ms, and at 16 rows MKL is ~4x slower
against the `[out, in]` layout a fast unpacker writes, so the 16-stream floor fell from 4x to 2x.
The packed copy costs 80 MB for SmolLM2, and a Q8_0 head kept packed only (`Q8Linear`, 113 MB fp32,
32 MB packed) gives back as much, so the model's resident weights did not grow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from adapters.local.kernels import CpuKernels

FUSED_MAX_ROWS = 4
"""Most rows a Q4_1 product runs through the packed kernel; more run by MKL on the fp32 copy. At 8
rows the two cost the same on the dev box (46 vs 50 ms for all layers), at 4 the kernel takes 19
against 47 ms."""
Q4_1_BLOCK = 32
"""Weights per block, in Q4_1 as in Q8_0."""


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
    """A Q4_1 weight `[out, in]` kept packed, `qs` `[out, in/2]` bytes (GGUF's nibble order),
    `scale` and `offset` `[out, in/32]` fp32, for products of a few rows; and unpacked
    (`weight_t`, fp32 `[in, out]`) for products of many, which MKL runs at its compute peak."""

    qs: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    weight_t: torch.Tensor
    kernel: CpuKernels

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.scale, self.offset, self.weight_t))

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > FUSED_MAX_ROWS:
            return x @ self.weight_t
        out = torch.empty(x.shape[0], self.qs.shape[0], dtype=torch.float32)
        self.kernel.matmul(_rows_contiguous(x), self.qs, self.scale, self.offset, out, accumulate=False)
        return out

    def addmm_(self, out: torch.Tensor, x: torch.Tensor) -> None:
        if x.shape[0] > FUSED_MAX_ROWS or out.stride(-1) != 1:
            out.addmm_(x, self.weight_t)
            return
        self.kernel.matmul(_rows_contiguous(x), self.qs, self.scale, self.offset, out, accumulate=True)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight_t.index_select(1, ids).t().contiguous()


@dataclass(slots=True)
class Q8Linear:
    """A Q8_0 weight `[out, in]` kept packed: `qs` `[out, in]` int8, `scale` `[out, in/32]` fp32.
    GGUF files often store the embedding table so; tied to the head, it is the step's biggest
    matrix (SmolLM2: 49,152 x 576, 113 MB in fp32, 32 MB packed). Every product runs through the
    kernel: the head multiplies only the rows that give logits, a few per step."""

    qs: torch.Tensor
    scale: torch.Tensor
    kernel: CpuKernels

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.scale))

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel.q8_matmul(_rows_contiguous(x), self.qs, self.scale)

    def addmm_(self, out: torch.Tensor, x: torch.Tensor) -> None:
        out.add_(self.mm(x))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_q8_0(self.qs[ids], self.scale[ids])


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
    """The weight `name` from a checkpoint: dense in `dtype` (`{name}_t`), with its Q4_1 packing
    (`{name}.qs/.scale/.offset`) when the checkpoint has it and the kernels run in this dtype; a
    Q8_0 matrix (`{name}.qs/.scale`, no dense copy) packed, or unpacked where the kernels do not run."""
    if f"{name}.qs" not in tensors:
        return DenseLinear(tensors[f"{name}_t"].to(dtype).contiguous())
    if f"{name}.offset" not in tensors:  # Q8_0
        q8, q8_scale = tensors[f"{name}.qs"].contiguous(), tensors[f"{name}.scale"].contiguous()
        if kernel is not None and dtype == torch.float32:
            return Q8Linear(qs=q8, scale=q8_scale, kernel=kernel)
        return DenseLinear(dequantize_q8_0(q8, q8_scale).t().to(dtype).contiguous())
    qs, scale, offset = (tensors[f"{name}.{part}"].contiguous() for part in ("qs", "scale", "offset"))
    weight_t = tensors[f"{name}_t"].to(dtype).contiguous()
    if kernel is not None and dtype == torch.float32:
        return Q4Linear(qs=qs, scale=scale, offset=offset, weight_t=weight_t, kernel=kernel)
    return DenseLinear(weight_t)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 and x.dtype == torch.float32 else x.to(torch.float32).contiguous()
