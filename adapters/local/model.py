"""Our Llama forward pass (RMSNorm, RoPE, grouped-query attention, SwiGLU) over the paged KV pool.

One call runs one scheduler step: every sequence's new tokens are packed into a single
`[tokens, hidden]` matrix, so the linear layers (nearly all the FLOPs) run once per step for the
whole batch. Only attention depends on each sequence's pages (see `attention`): decode rows
attend per run of pages, shared runs once for all their rows; a prefill chunk attends over its
prefix runs and, causally, itself. New K/V is written into the pool before attention reads it.

A step of decode rows only takes a leaner path (`LlamaModel._decode`): one row per sequence makes
every op's dispatch cost more than its arithmetic, so it runs as few ops per layer as it can.

Logits are computed only for the rows the sampler reads (`logit_rows`), which saves the
`[tokens, vocab]` head matmul that a plain forward over a prompt computes.

Numerics follow `transformers`' Llama: RoPE tables in fp32 from `inv_freq`, "rotate half"
(as a roll against a sign-folded sine table), RMSNorm in fp32. Weights come from gguf_convert
in the fused layout (wqkv, w_gate_up).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from adapters.local.attention import (
    context_slots,
    decode_attention,
    prefill_attention,
    run_windows,
    windowed_attention,
)
from adapters.local.attention_plan import DecodePlan
from adapters.local.config import DecodeWeights, PrefillActivations
from adapters.local.forward_batch import ForwardBatch
from adapters.local.gguf_convert import ModelSpec
from adapters.local.kernels import CpuKernels
from adapters.local.kv_pool import KVPool
from adapters.local.linear import Linear, RowSpans, build_linear, clip_spans, kept, merged_spans
from adapters.local.matmul_attention import matmul_attends, run_matmul_attention
from adapters.local.stock_linear import INT4_MAX_ROWS, build_stock_linear, prompt_weights

DECODE_WINDOWS = 4
"""Windows one page run is cut into for decode attention: 4 x 3 KV heads = 12 work units keep two
threads busy where the 3 of one flash call left one idle a third of the time (see `windowed_attention`)."""
DECODE_WINDOW_MIN_TOKENS = 256
"""Shortest window worth a unit of its own; shorter runs get fewer windows."""
_Norm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
"""RMSNorm of rows `x` by `weight` with `eps`."""
KERNEL_HEAD_DIM = 64
"""The one head dimension the C attention kernels handle; other models attend with torch."""
KERNEL_MAX_GROUP = 12
"""Most query heads per KV head the C prefill attention takes (its unit of work is 12 queries)."""
MLP_BLOCK_ROWS = 512
"""Rows per SwiGLU block: big enough for full-speed matmuls, small enough to bound the temporaries
(6 MB at 512). A default 512-token chunk is one block: MKL runs the MLP's products at 136-150
GFLOP/s at 512 rows against 126 at 256 (dev box); 16 x 128-token prompts prefilled 4 % faster."""


@dataclass(slots=True)
class _Layer:
    """One block's weights."""

    attn_norm: torch.Tensor
    wqkv: Linear
    wo: Linear
    ffn_norm: torch.Tensor
    w_gate_up: Linear
    w_down: Linear


class LlamaModel:
    """Stateless forward over weights held as plain tensors; state lives in the KV pool."""

    def __init__(
        self,
        spec: ModelSpec,
        tensors: dict[str, torch.Tensor],
        dtype: torch.dtype,
        kernel: CpuKernels | None = None,
        prefill_activations: PrefillActivations = "fp32",
        decode_weights: DecodeWeights = "fp32",
    ) -> None:
        """`kernel`: the C kernels for decode steps (packed products, see `linear`; attention;
        RMSNorm), used in float32 only; None: torch ops throughout, decode rows on packed weights
        (`stock_linear`) where `decode_weights` is "packed", else dense. `prefill_activations`,
        `decode_weights`: see `LocalEngineConfig`."""
        self.spec = spec
        self.dtype = dtype
        self._kernels = kernel if dtype == torch.float32 else None
        self.attends_in_kernel = self._kernels is not None and spec.head_dim == KERNEL_HEAD_DIM
        """Decode rows and prompt chunks attend in the C kernels over a float32 pool (`kernel_attends`):
        the runner plans decode rows as `DecodePlan.segments`; a chunk's context is its prefix plan
        and its own slots."""
        self.serves_packed = self._kernels is None and decode_weights == "packed"
        """Decode rows multiply packed weights in torch's kernels (`stock_linear`), and torch attends."""
        self.decode_row_limit = INT4_MAX_ROWS if self.serves_packed else None
        """Most decode rows a step takes (`stock_linear.INT4_MAX_ROWS`), so the room for speculative
        drafts; None: no limit of the model's own."""

        # Keep copies, not views of the checkpoint's file, where part of the file goes unread: int8
        # prefill leaves its fp32 copies unread, and torch's path its packed nibbles once converted
        # (as views, the ~80 MB of them read once would stay resident; see `linear.owned`).
        int8_prefill: PrefillActivations = "fp32" if prefill_activations == "fp32" else "int8"
        vnni = self._kernels is not None and self._kernels.vnni
        copy = self.serves_packed or (int8_prefill == "int8" and vnni)
        prompt = prompt_weights(prefill_activations, dtype)

        def get(name: str) -> torch.Tensor:
            return kept(copy)(tensors[name].to(dtype))

        def linear(name: str) -> Linear:
            if self.serves_packed:
                return build_stock_linear(tensors, name, dtype, copy=copy, prompt=prompt)
            return build_linear(tensors, name, dtype, kernel, int8_prefill, copy=copy)

        self.embed = get("embed") if "embed" in tensors else None
        """`[vocab, hidden]` when untied; None: tokens are looked up in the head's rows."""
        self.norm = get("norm")
        self.lm_head = linear("lm_head")
        self.layers = [
            _Layer(
                attn_norm=get(f"layers.{i}.attn_norm"),
                wqkv=linear(f"layers.{i}.wqkv"),
                wo=linear(f"layers.{i}.wo"),
                ffn_norm=get(f"layers.{i}.ffn_norm"),
                w_gate_up=linear(f"layers.{i}.w_gate_up"),
                w_down=linear(f"layers.{i}.w_down"),
            )
            for i in range(spec.num_layers)
        ]
        distinct = {id(t): t for t in (self.embed, self.norm) if t is not None}
        for layer in self.layers:
            distinct[id(layer.attn_norm)] = layer.attn_norm
            distinct[id(layer.ffn_norm)] = layer.ffn_norm
        matrices = self.lm_head.nbytes + sum(m.nbytes for layer in self.layers for m in _matrices(layer))
        self.weight_bytes = matrices + sum(t.numel() * t.element_size() for t in distinct.values())
        """Bytes of all weights (a tied head counted once)."""
        half = spec.head_dim // 2
        inv_freq = 1.0 / (
            spec.rope_theta ** (torch.arange(0, spec.head_dim, 2, dtype=torch.int64).float() / spec.head_dim)
        )
        angles = torch.arange(spec.context_length, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self._inv_freq = inv_freq
        # Half-width tables (both halves of a head use the same angles): 2 MB instead of 4 at 8k context.
        self._cos_half = angles.cos().to(dtype)
        self._sin_half = angles.sin().to(dtype)
        self._half = half
        # roll(x, half) as a matrix: x @ _roll[i] == roll(x, half)[i]; decode builds RoPE from it.
        self._roll = torch.eye(spec.head_dim, dtype=dtype).roll(half, dims=1)

    def kernel_attends(self, pool: KVPool) -> bool:
        """Whether the C kernels attend over `pool` (they read float32 pages only)."""
        return self.attends_in_kernel and pool.k.dtype == torch.float32

    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Run one step, write the new tokens' K/V into the pool, return fp32 logits `[rows, vocab]`."""
        spec = self.spec
        if batch.decode is not None and not batch.prefills:
            return self._decode(batch, batch.decode, pool)
        x = self._embed(batch.token_ids)
        # In-place where the math allows: fewer temporaries keep a long prefill chunk's peak memory low.
        last = len(self.layers) - 1
        norm = self._norm(_fused_rms_norm)
        contexts = None
        if self.kernel_attends(pool) and spec.num_heads // spec.num_kv_heads <= KERNEL_MAX_GROUP:
            contexts = [  # once a step
                context_slots(seg.prefix, batch.slots[seg.start : seg.start + seg.length], pool.page_size)
                for seg in batch.prefills
            ]
        in_kernel = contexts is not None and self._kernels is not None  # RoPE and K/V writes in C
        rope = None if in_kernel else self._rotation(batch.positions)
        # Rows of long prompts may take int8 activations (`prefill_activations`), decided per sequence.
        int8_rows = merged_spans([(seg.start, seg.start + seg.length) for seg in batch.prefills if seg.int8])
        decode_rows = batch.decode.count if batch.decode is not None else 0  # the step's first rows
        for index, layer in enumerate(self.layers):
            attn = self._attention_half(batch, x, index, pool, norm, rope, contexts, int8_rows, decode_rows)
            if index == last:
                # Every row's K/V is in the pool now; only the rows that give logits need the rest.
                x, attn = x[batch.logit_rows], attn[batch.logit_rows]
                int8_rows = _logit_spans(int8_rows, batch.logit_rows.tolist())
            layer.wo.addmm_(x, attn, int8_rows, decode_rows)
            del attn  # before the MLP allocates its intermediate, a chunk's largest temporary
            self._mlp(x, layer, norm, int8_rows, decode_rows)
        return self.lm_head.mm(norm(x, self.norm, spec.rms_norm_eps)).float()

    def _attention_half(
        self,
        batch: ForwardBatch,
        x: torch.Tensor,
        index: int,
        pool: KVPool,
        norm: _Norm,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        contexts: list[torch.Tensor] | None,
        int8_rows: RowSpans,
        decode_rows: int,
    ) -> torch.Tensor:
        """Layer `index`'s attention for a step with prompt rows: its rows' K/V written into the pool,
        the output `[rows, heads * head_dim]` returned. `rope`: `_rotation`'s tables, None where the C
        kernel rotates and writes. A method of its own so that its temporaries (the normed rows,
        `qkv`, the rotated copy) are freed before the MLP's: at a 512-token chunk the engine's heap
        then grows 21-28 MiB in a step instead of 31-39 (AMD EPYC Zen 3, 2026-12-07)."""
        spec = self.spec
        n_q, n_kv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
        layer = self.layers[index]
        qkv = layer.wqkv.mm(norm(x, layer.attn_norm, spec.rms_norm_eps), int8_rows, decode_rows)
        k_pages, v_pages = pool.k[index], pool.v[index]
        if rope is None:
            assert self._kernels is not None  # no rotation tables only where the kernel rotates
            q = self._kernels.rope_store(
                qkv, n_q, batch.positions, self._cos_half, self._sin_half, k_pages, v_pages, batch.slots
            )
            return self._attention(batch, q, None, None, k_pages, v_pages, contexts)
        cos, sin = rope
        qk = qkv[:, : (n_q + n_kv) * hd].view(-1, n_q + n_kv, hd)
        rotated = qk.roll(self._half, dims=-1)
        qk.mul_(cos).addcmul_(rotated, sin)  # in place: qkv is a temporary
        del rotated
        q, k = qk[:, :n_q], qk[:, n_q:]
        v = qkv[:, (n_q + n_kv) * hd :].view(-1, n_kv, hd)
        KVPool.slots(k_pages).index_copy_(1, batch.slots, k.transpose(0, 1).to(k_pages.dtype))
        KVPool.slots(v_pages).index_copy_(1, batch.slots, v.transpose(0, 1).to(v_pages.dtype))
        return self._attention(batch, q, k, v, k_pages, v_pages, contexts)

    def shift_keys(
        self, pool: KVPool, slots: list[int], shift: int, sources: list[int] | None = None
    ) -> None:
        """Move the keys stored in token `slots` (every layer) `shift` positions back, in place, or
        write there those of `sources` moved so: RoPE rotates each pair of a head by position x
        frequency, so rotating a stored key by `-shift` x frequency leaves it as if rotated at its
        position minus `shift` (`window`)."""
        if not slots or (shift == 0 and sources is None):
            return
        half = self._half
        angles = shift * self._inv_freq.double()
        index = torch.tensor(slots, dtype=torch.long)
        flat = KVPool.slots(pool.k)
        keys = flat.index_select(2, index if sources is None else torch.tensor(sources, dtype=torch.long))
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        low, high = keys[..., :half], keys[..., half:]
        rotated = torch.cat([low * cos + high * sin, high * cos - low * sin], dim=-1)
        flat.index_copy_(2, index, rotated.to(flat.dtype))  # rotated in fp32 from a half pool

    def _rotation(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's `cos` and `sin` `[rows, 1, head_dim]` for torch's path of a prefill step."""
        cos_half, sin_half = self._cos_half[positions], self._sin_half[positions]
        cos = torch.cat([cos_half, cos_half], dim=-1).unsqueeze(1)
        # rotate_half(x) * sin == roll(x, half) * [-sin, sin]: one roll instead of slice/neg/cat.
        return cos, torch.cat([-sin_half, sin_half], dim=-1).unsqueeze(1)

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            return F.embedding(token_ids, self.embed)
        return self.lm_head.rows(token_ids).to(self.dtype)

    def _decode(self, batch: ForwardBatch, plan: DecodePlan, pool: KVPool) -> torch.Tensor:
        """A step of decode rows only, with as few ops per layer as the math allows: at one row per
        sequence every op costs more in dispatch than in arithmetic. RoPE is one batched matmul
        by a per-row rotation matrix (built once per step, shared by all layers), K/V go to the
        pool through flat per-layer views, residual adds ride on the matmuls (`addmm_`), and a
        plan with a single page run (one stream, or streams on one shared prefix) is attended by two
        matmuls (`matmul_attention`) or in windows of the run (`windowed_attention`), over views of
        the pool built once per step."""
        spec = self.spec
        n_q, n_kv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
        rows, qk_width, ffn = plan.count, (n_q + n_kv) * hd, spec.intermediate_size
        x = self._embed(batch.token_ids)
        cos_half, sin_half = self._cos_half[batch.positions], self._sin_half[batch.positions]
        rope = torch.diag_embed(torch.cat([cos_half, cos_half], dim=-1))
        rope.addcmul_(self._roll, torch.cat([-sin_half, sin_half], dim=-1).unsqueeze(1))
        k_slots, v_slots = KVPool.slots(pool.k), KVPool.slots(pool.v)
        windows, by_matmul = None, matmul_attends(pool.k.dtype)
        if plan.segments is None and len(plan.runs) == 1 and not plan.merge and plan.gathered is None:
            run = plan.runs[0].run
            count = max(1, min(DECODE_WINDOWS, run.tokens // DECODE_WINDOW_MIN_TOKENS))
            windows = run_windows(pool.k, pool.v, run, 1 if by_matmul else count)
        eps = spec.rms_norm_eps
        kernels = self._kernels
        norm = self._norm(_rms_norm)
        for index, layer in enumerate(self.layers):
            qkv = layer.wqkv.mm(norm(x, layer.attn_norm, eps), decode_rows=rows)
            qk = torch.bmm(qkv[:, :qk_width].view(rows, n_q + n_kv, hd), rope)
            k_slots[index].index_copy_(1, batch.slots, qk[:, n_q:].transpose(0, 1).to(k_slots.dtype))
            v_slots[index].index_copy_(
                1, batch.slots, qkv[:, qk_width:].view(rows, n_kv, hd).transpose(0, 1).to(v_slots.dtype)
            )
            q = qk[:, :n_q]
            if plan.segments is not None and kernels is not None:
                attn = kernels.decode_attention(q.contiguous(), pool.k[index], pool.v[index], plan.segments)
            elif windows is not None:
                over_run = run_matmul_attention if by_matmul else windowed_attention
                attn = over_run(q, windows.keys[index], windows.values[index], windows.mask)
            else:
                attn = decode_attention(q, pool.k[index], pool.v[index], plan)
            layer.wo.addmm_(x, attn, decode_rows=rows)
            gate_up = layer.w_gate_up.mm(norm(x, layer.ffn_norm, eps), decode_rows=rows)
            gate = F.silu(gate_up[:, :ffn], inplace=True).mul_(gate_up[:, ffn:])
            layer.w_down.addmm_(x, gate, decode_rows=rows)
        return self.lm_head.mm(norm(x, self.norm, eps), decode_rows=rows).float()

    def _norm(self, fallback: _Norm) -> _Norm:
        """RMSNorm in the C kernel where it runs (one call instead of six torch ops; a 512-row
        chunk's 61 norms took ~30 ms in torch), else `fallback`."""
        if self._kernels is not None and self.spec.hidden_size % 16 == 0:
            return self._kernels.rms_norm
        return fallback

    def _mlp(
        self, x: torch.Tensor, layer: _Layer, norm: _Norm, int8_rows: RowSpans, decode_rows: int
    ) -> torch.Tensor:
        """`x += SwiGLU(RMSNorm(x))` in blocks of rows: a long chunk's `[rows, 2 * ffn]`
        intermediate would otherwise be its largest temporary (12.6 MB at 1,024 rows)."""
        spec = self.spec
        kernels = self._kernels if spec.intermediate_size % 16 == 0 else None
        for start in range(0, x.shape[0], MLP_BLOCK_ROWS):
            rows = x[start : start + MLP_BLOCK_ROWS]
            block = clip_spans(int8_rows, start, start + rows.shape[0])
            decoding = min(rows.shape[0], max(0, decode_rows - start))
            gate_up = layer.w_gate_up.mm(norm(rows, layer.ffn_norm, spec.rms_norm_eps), block, decoding)
            if kernels is not None:
                layer.w_down.addmm_(rows, kernels.swiglu(gate_up), block, decoding)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                rows.add_(layer.w_down.mm(F.silu(gate, inplace=True).mul_(up), block, decoding))
        return x

    def _attention(
        self,
        batch: ForwardBatch,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        contexts: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        """Decode rows and prompt chunks of a step; `contexts`: each chunk's context slots where the
        C kernel attends (`context_slots`; the chunk's own `k`, `v` then unused, None), None: torch's
        flash kernel over the page runs, with the chunk's `k` and `v`."""
        plan = batch.decode  # decode-only steps take `_decode` instead
        kernels = self._kernels
        if plan is None and len(batch.prefills) == 1:
            if contexts is not None and kernels is not None:
                return kernels.prefill_attention(q.contiguous(), k_pages, v_pages, contexts[0])
            assert k is not None and v is not None  # computed wherever the kernel does not attend
            return prefill_attention(q, k, v, k_pages, v_pages, batch.prefills[0].prefix)
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
        if plan is not None and plan.segments is not None and self._kernels is not None:
            decoding = q[: plan.count].contiguous()
            out[: plan.count] = self._kernels.decode_attention(decoding, k_pages, v_pages, plan.segments)
        elif plan is not None:
            out[: plan.count] = decode_attention(q[: plan.count], k_pages, v_pages, plan)
        for number, seg in enumerate(batch.prefills):
            rows = slice(seg.start, seg.start + seg.length)
            if contexts is not None and kernels is not None:
                out[rows] = kernels.prefill_attention(
                    q[rows].contiguous(), k_pages, v_pages, contexts[number]
                )
            else:
                assert k is not None and v is not None
                out[rows] = prefill_attention(q[rows], k[rows], v[rows], k_pages, v_pages, seg.prefix)
        return out


def _logit_spans(int8_rows: RowSpans, logit_rows: list[int]) -> RowSpans:
    """`int8_rows` among the logit rows, by their place in `logit_rows`."""
    inside = [i for i, row in enumerate(logit_rows) if any(a <= row < b for a, b in int8_rows)]
    return merged_spans([(i, i + 1) for i in inside])


def _matrices(layer: _Layer) -> tuple[Linear, ...]:
    return (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)


def _fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`F.rms_norm`: for a prefill chunk's many rows one fused op, without `_rms_norm`'s temporaries."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as `transformers` writes it: for a few fp32 decode rows these six small ops cost
    less than `F.rms_norm`'s dispatch (28 vs 39 us per call on the dev box). Other dtypes keep
    `F.rms_norm`, which accumulates in fp32."""
    if x.dtype != torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return torch.mul(x, torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))).mul_(weight)
