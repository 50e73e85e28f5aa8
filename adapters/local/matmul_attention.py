"""Decode attention over one page run as two batched matmuls, where that beats torch's flash kernel.

A decode row's attention is one query per head against every key of its context: too little work
per key block for the flash kernel, which splits queries into blocks and converts each key block
before its product. With the grouped query heads of a KV head folded into one `[groups, d]` block,
scores and output are each a single `bmm` over the run's `[kv_heads, tokens, d]` view of the pool,
and the softmax runs in float32 between them.

Measured (`benchmarks/results/engine_quantized.md`, AMD EPYC, 2 threads, 30 layers, 2,176 tokens,
one row): a bfloat16 pool 3.4 ms against 8.8 for one flash call, where oneDNN multiplies bfloat16
natively (AVX512-BF16, AMX); with AVX2 code the same `bmm` took 40 ms, so there the flash kernel
stays. oneDNN copies a pool view (a batch of heads at the pool's head stride) slowly inside its
bfloat16 `bmm` (7.6 ms), so the run's keys and values are copied first. A float32 pool 4.7 ms on
its views against 7.8-7.9 for flash, with either code (MKL takes the strides as they are).

bfloat16 scores are rounded to bfloat16 (torch's CPU `bmm` returns its inputs' dtype), as the
packed products' outputs already are; the quality this costs is measured beside theirs.
"""

from __future__ import annotations

import functools
import math
import platform

import torch

from adapters.local.kv_pool import onednn_reports


def matmul_attends(dtype: torch.dtype) -> bool:
    """Whether decode rows over one run attend by `run_matmul_attention` in a pool of `dtype`: float32
    on every host, bfloat16 where the CPU multiplies it natively (`native_bf16_matmul`)."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and native_bf16_matmul())


@functools.cache
def native_bf16_matmul() -> bool:
    """oneDNN may use bfloat16 instructions (it honours `ONEDNN_MAX_CPU_ISA`), and on x86 the CPU
    has them (AVX512-BF16 or AMX): without them oneDNN emulates bfloat16 far slower than flash."""
    allowed = onednn_reports("_is_mkldnn_bf16_supported")
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return allowed  # ARM: oneDNN reports bf16 only where the CPU has its dot products
    return allowed and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def run_matmul_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """`[r, heads * d]`: rows `q` (`[r, heads, d]`) over one run, all of it visible, from one
    layer's `RunWindows` views cut into a single window (`[1, kv_heads, tokens, d]`, no mask)."""
    if keys.shape[0] != 1 or mask is not None:
        raise ValueError("matmul attention takes the run as one window")
    r, heads, dim = q.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    scaled = q * (1.0 / math.sqrt(dim))
    folded = scaled.reshape(r, kv_heads, groups, dim).transpose(0, 1).reshape(kv_heads, r * groups, dim)
    keys, values = keys[0], values[0]
    if keys.dtype != torch.float32:  # see the module's docstring
        keys, values = keys.contiguous(), values.contiguous()
    scores = torch.bmm(folded.to(keys.dtype), keys.transpose(1, 2))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    out = torch.bmm(probs, values)
    return out.view(kv_heads, r, groups, dim).transpose(0, 1).reshape(r, heads * dim).to(q.dtype)
