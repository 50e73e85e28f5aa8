"""The model's weight matrices: dense (`x @ w_t`) or Q4_1-packed (through `kernels`).

A GGUF whose layer matrices are Q4_1 (the default SmolLM2 file) keeps them packed: 0.75 bytes per
weight instead of 4. A decode step reads every weight once for a row or a few, so its products are
memory-bound and run through the kernel straight from the packed bytes (the 120 layer products of
a SmolLM2 decode step: 10.6 against 27.3 ms fp32 on the 2-core dev box). Steps with more rows
(prefill chunks, big decode batches) are compute-bound: each matrix is unpacked into a per-thread
scratch and multiplied by MKL, which costs one unpacking pass (~20 ms per step for all layers)
and nothing else. Either way the weights are the same fp32 values `gguf` dequantizes to.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

import torch

from adapters.local.kernels import CpuKernels

FUSED_MAX_ROWS = 4
"""Most rows a packed product runs through the fused kernel; more are unpacked and run by MKL.
At 8 rows the two cost the same on the dev box (46 vs 50 ms for all layers), at 4 the kernel
takes 19 against 47 ms."""
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


_Held = dict[tuple[int, int], tuple[int, torch.Tensor]]
"""Per shape: the id of the weight a buffer holds, and the buffer."""


class DequantScratch:
    """One reusable fp32 buffer per weight shape and thread, for unpacked matrices, remembering
    whose weights it holds: a prefill chunk's SwiGLU runs in blocks of rows, and the second block
    finds its matrix already unpacked. Per thread: engines that share a loaded model each run it
    on their own thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def unpacked(self, owner: Q4Linear) -> torch.Tensor:
        """`owner`'s weights `[out, in]` fp32, unpacked into this thread's buffer of that shape
        unless that buffer holds them already."""
        buffers: _Held | None = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = {}
        shape = (owner.qs.shape[0], owner.qs.shape[1] * 2)
        held = buffers.get(shape)
        if held is not None and held[0] == id(owner):
            return held[1]
        weight = held[1] if held is not None else torch.empty(shape, dtype=torch.float32)
        owner.kernel.dequantize(owner.qs, owner.scale, owner.offset, weight)
        buffers[shape] = (id(owner), weight)
        return weight


@dataclass(slots=True)
class Q4Linear:
    """A Q4_1 weight `[out, in]` kept packed: `qs` `[out, in/2]` bytes (GGUF's nibble order),
    `scale` and `offset` `[out, in/32]` fp32."""

    qs: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    kernel: CpuKernels
    scratch: DequantScratch

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.scale, self.offset))

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > FUSED_MAX_ROWS:
            return torch.mm(x, self._unpacked().t())
        out = torch.empty(x.shape[0], self.qs.shape[0], dtype=torch.float32)
        self.kernel.matmul(_rows_contiguous(x), self.qs, self.scale, self.offset, out, accumulate=False)
        return out

    def addmm_(self, out: torch.Tensor, x: torch.Tensor) -> None:
        if x.shape[0] > FUSED_MAX_ROWS or out.stride(-1) != 1:
            out.addmm_(x, self._unpacked().t())
            return
        self.kernel.matmul(_rows_contiguous(x), self.qs, self.scale, self.offset, out, accumulate=True)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_q4_1(self.qs[ids], self.scale[ids], self.offset[ids])

    def _unpacked(self) -> torch.Tensor:
        return self.scratch.unpacked(self)


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
    tensors: dict[str, torch.Tensor],
    name: str,
    dtype: torch.dtype,
    kernel: CpuKernels | None,
    scratch: DequantScratch,
) -> Linear:
    """The weight `name` from a checkpoint: packed (Q4_1 `{name}.qs/.scale/.offset`, Q8_0
    `{name}.qs/.scale`) when it is and the kernels run in this dtype, else dense in `dtype`
    (`{name}_t`, or the packed one unpacked)."""
    if f"{name}.qs" not in tensors:
        return DenseLinear(tensors[f"{name}_t"].to(dtype).contiguous())
    if f"{name}.offset" not in tensors:  # Q8_0
        q8, q8_scale = tensors[f"{name}.qs"].contiguous(), tensors[f"{name}.scale"].contiguous()
        if kernel is not None and dtype == torch.float32:
            return Q8Linear(qs=q8, scale=q8_scale, kernel=kernel)
        return DenseLinear(dequantize_q8_0(q8, q8_scale).t().to(dtype).contiguous())
    qs, scale, offset = (tensors[f"{name}.{part}"].contiguous() for part in ("qs", "scale", "offset"))
    if kernel is not None and dtype == torch.float32:
        return Q4Linear(qs=qs, scale=scale, offset=offset, kernel=kernel, scratch=scratch)
    return DenseLinear(dequantize_q4_1(qs, scale, offset).t().to(dtype).contiguous())


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 and x.dtype == torch.float32 else x.to(torch.float32).contiguous()
