"""The engine's C kernels against torch: packed Q4_1/Q8_0 products, decode attention, RMSNorm;
GGUF blocks unpacked to exactly `gguf`'s values; and the fallback where no kernel builds."""

from __future__ import annotations

import platform
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf.quants import dequantize, quantize

from adapters.local import kernels as kernels_module
from adapters.local.attention import context_slots
from adapters.local.attention_plan import PageRun, PrefixPlan, ScatteredPages, pool_rows, segments
from adapters.local.gguf_convert import _q4_1_parts, _q8_0_parts
from adapters.local.kernels import CpuKernels, load_kernel
from adapters.local.linear import (
    FUSED_MAX_ROWS,
    Q4Linear,
    Q8Linear,
    clip_spans,
    dequantize_q4_1,
    dequantize_q8_0,
    interleave_q4_1,
    interleave_q4_1_vnni,
    interleave_q8_0,
    merged_spans,
)
from adapters.local.model import _rms_norm
from tests.adapters.local.conftest import TEST_CONFIG, c_kernels_anywhere

GGML = gguf.GGMLQuantizationType


def by_token(layer: torch.Tensor) -> torch.Tensor:
    """A pool layer (`[kv_heads, pages, page_size, d]`) indexed page first, for the references."""
    return layer.permute(1, 2, 0, 3)


# Where the model loads find them too: the portable build is compiled once (11 s) for the whole suite.
KERNEL_CACHE = TEST_CONFIG.resolved_cache_dir()


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    """The native build where this CPU has AVX-512, else the portable one: every host tests the C."""
    return c_kernels_anywhere(KERNEL_CACHE)


def _gguf_tensor(values: np.ndarray, qtype: GGML) -> SimpleNamespace:
    """What `gguf.GGUFReader` gives for a quantized 2-D tensor: raw block bytes, reversed shape."""
    rows, cols = values.shape
    return SimpleNamespace(data=quantize(values, qtype), shape=[cols, rows], tensor_type=qtype)


def _q4_1_weight(rows: int, cols: int, seed: int = 0) -> tuple[SimpleNamespace, torch.Tensor]:
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05
    tensor = _gguf_tensor(values, GGML.Q4_1)
    reference = torch.from_numpy(dequantize(tensor.data, GGML.Q4_1).reshape(rows, cols).copy())
    return tensor, reference


def test_q4_1_blocks_unpack_to_ggufs_exact_values() -> None:
    tensor, reference = _q4_1_weight(40, 96)
    qs, scale, offset = _q4_1_parts(tensor, heads=0)  # type: ignore[arg-type]
    assert torch.equal(dequantize_q4_1(qs, scale, offset), reference)


def test_q8_0_blocks_unpack_to_ggufs_exact_values() -> None:
    values = np.random.default_rng(1).standard_normal((40, 64)).astype(np.float32)
    tensor = _gguf_tensor(values, GGML.Q8_0)
    qs, scale = _q8_0_parts(tensor)  # type: ignore[arg-type]
    reference = torch.from_numpy(dequantize(tensor.data, GGML.Q8_0).reshape(40, 64).copy())
    assert torch.equal(dequantize_q8_0(qs, scale), reference)


def test_interleaved_layouts_hold_the_same_weights() -> None:
    tensor, weight = _q4_1_weight(64, 96, seed=7)
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    # Output 16g + j, inputs 2p and 2p + 1: the low and high nibble of byte j of pair p of group g.
    g, j, p = 2, 5, 17
    n, block = 16 * g + j, 2 * p // 32
    for k, value in ((2 * p, packed[g, p, j] & 15), (2 * p + 1, packed[g, p, j] >> 4)):
        assert scale[g, block, j] * value.float() + offset[g, block, j] == weight[n, k]
    values = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)
    q8, q8_scale = _q8_0_parts(_gguf_tensor(values, GGML.Q8_0))  # type: ignore[arg-type]
    q8_packed, q8_packed_scale = interleave_q8_0(q8, q8_scale)
    assert torch.equal(q8_packed[1, 40, 3], q8[19, 40])
    assert torch.equal(q8_packed_scale[1, 1, 3], q8_scale[19, 1])


# 1-4 rows: the few-row tile (two groups of 16 outputs); more: tiles of 16 rows, the last one partial.
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 9, 16, 17, 40])
def test_q4_linear_matches_the_dense_product(kernels: CpuKernels, rows: int) -> None:
    tensor, weight = _q4_1_weight(96, 128, seed=rows)
    qs, scale, offset = _q4_1_parts(tensor, heads=0)  # type: ignore[arg-type]
    dense_t = dequantize_q4_1(qs, scale, offset).t().contiguous()
    linear = Q4Linear(*interleave_q4_1(qs, scale, offset), weight_t=dense_t, kernel=kernels)
    wide = torch.randn(rows, 256)
    x = wide[:, 64:192]  # rows 256 floats apart: the kernel takes any row stride
    expected = x @ weight.t()
    torch.testing.assert_close(linear.mm(x), expected, rtol=1e-5, atol=1e-5)
    residual = torch.randn(rows, 96)
    into = residual.clone()
    linear.addmm_(into, x)
    torch.testing.assert_close(into, residual + expected, rtol=1e-5, atol=1e-5)
    ids = torch.tensor([3, 0, 95])
    assert torch.equal(linear.rows(ids), weight[ids])


def test_q4_linear_runs_long_chunks_on_the_dense_copy(kernels: CpuKernels) -> None:
    tensor, weight = _q4_1_weight(32, 64, seed=11)
    qs, scale, offset = _q4_1_parts(tensor, heads=0)  # type: ignore[arg-type]
    linear = Q4Linear(*interleave_q4_1(qs, scale, offset), weight_t=weight.t().contiguous(), kernel=kernels)
    x = torch.randn(FUSED_MAX_ROWS + 1, 64)
    torch.testing.assert_close(linear.mm(x), x @ weight.t(), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def vnni_kernels(kernels: CpuKernels) -> CpuKernels:
    """VNNI's products: native where the CPU has VNNI, else the portable build's emulation."""
    if kernels.vnni:
        return kernels
    portable = load_kernel(KERNEL_CACHE, portable=True)
    assert portable is not None and portable.vnni
    return portable


def _int8_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` as the int8 kernel sees it: each block of 32 quantized to `round(x * 127 / max|x|)`,
    scaled back. With Q4_1's offset paired with the quantized sums, the kernel's product is
    exactly this times the dense weights, up to fp32 rounding."""
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    # `127 / tensor` would be torch's reciprocal times 127, an ulp off the kernel's division for about
    # a quarter of the blocks: enough to round an element near a half the other way now and then.
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inverse).clamp(-127, 127)
    return (q * (amax / 127)).reshape(rows, cols)


def test_vnni_layout_holds_the_same_nibbles() -> None:
    tensor, weight = _q4_1_weight(32, 64, seed=8)
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    vnni = interleave_q4_1_vnni(packed)
    assert vnni.shape == (2, 8, 16, 4)
    # Byte t of output j in chunk c of group g: input 8c + t (low nibble), 8c + 4 + t (high).
    g, c, j, t = 1, 5, 9, 2
    n = 16 * g + j
    for k, value in ((8 * c + t, vnni[g, c, j, t] & 15), (8 * c + 4 + t, vnni[g, c, j, t] >> 4)):
        assert scale[g, k // 32, j] * value.float() + offset[g, k // 32, j] == weight[n, k]


# Prompt rows take int8 activations however many there are: one, partial and whole tiles of 8 rows,
# more than the exact kernel's FUSED_MAX_ROWS.
@pytest.mark.parametrize("rows", [1, 9, FUSED_MAX_ROWS + 1, 100])
def test_int8_prefill_products_quantize_each_block_of_each_row(vnni_kernels: CpuKernels, rows: int) -> None:
    tensor, weight = _q4_1_weight(64, 128, seed=rows)
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    linear = Q4Linear(packed, scale, offset, kernel=vnni_kernels, vnni=interleave_q4_1_vnni(packed))
    wide = torch.randn(rows, 256)
    x = wide[:, 64:192]
    x[0, :32] = 0.0  # an all-zero block quantizes to zeros, not NaN
    expected = _int8_rows(x) @ weight.t()
    torch.testing.assert_close(linear.mm(x, ((0, rows),)), expected, rtol=1e-4, atol=1e-4)
    exact = x @ weight.t()
    assert ((linear.mm(x, ((0, rows),)) - exact).norm() / exact.norm()).item() < 0.02
    residual = torch.randn(rows, 64)
    into = residual.clone()
    linear.addmm_(into, x, ((0, rows),))
    torch.testing.assert_close(into, residual + expected, rtol=1e-4, atol=1e-4)
    columns = torch.randn(64, rows).t()  # an output whose rows are not contiguous
    linear.addmm_(columns, x, ((0, rows),))
    assert torch.isfinite(columns).all()
    ids = torch.tensor([0, 17, 47])
    assert torch.equal(linear.rows(ids), weight[ids])  # no dense copy: rows come from the nibbles
    # Rows outside `int8_rows` (decode rows, short prompts) stay exact, in blocks of FUSED_MAX_ROWS.
    torch.testing.assert_close(linear.mm(x), exact, rtol=1e-5, atol=1e-5)
    middle = (rows // 3, rows // 3 + rows // 2)
    mixed = linear.mm(x, (middle,))
    inside = slice(*middle)
    torch.testing.assert_close(mixed[inside], expected[inside], rtol=1e-4, atol=1e-4)
    for outside in (slice(0, middle[0]), slice(middle[1], rows)):
        torch.testing.assert_close(mixed[outside], exact[outside], rtol=1e-5, atol=1e-5)


def test_row_spans_clip_and_merge() -> None:
    assert merged_spans([(5, 9), (0, 2), (2, 4), (9, 9)]) == ((0, 4), (5, 9))
    assert clip_spans(((0, 4), (5, 9), (12, 20)), 3, 13) == ((0, 1), (2, 6), (9, 10))


def test_the_int8_kernel_refuses_shapes_it_cannot_tile(vnni_kernels: CpuKernels) -> None:
    tensor, _ = _q4_1_weight(32, 64, seed=13)
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    vnni = interleave_q4_1_vnni(packed)
    with pytest.raises(ValueError, match="shapes"):
        vnni_kernels.matmul_int8(
            torch.randn(70, 64), vnni, scale, offset, torch.empty(70, 24), accumulate=False
        )
    empty = torch.empty(0, 32)
    vnni_kernels.matmul_int8(torch.randn(0, 64), vnni, scale, offset, empty, accumulate=False)


def test_the_kernel_refuses_outputs_it_cannot_tile(kernels: CpuKernels) -> None:
    tensor, _ = _q4_1_weight(48, 64, seed=12)  # 48 outputs: not whole pairs of groups
    packed, scale, offset = interleave_q4_1(*_q4_1_parts(tensor, heads=0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shapes"):
        kernels.matmul(torch.randn(1, 64), packed, scale, offset, torch.empty(1, 48), accumulate=False)


@pytest.mark.parametrize("rows", [0, 1, 4, 6, 16, 21])
def test_q8_linear_matches_the_dense_product(kernels: CpuKernels, rows: int) -> None:
    values = np.random.default_rng(2).standard_normal((64, 96)).astype(np.float32)
    tensor = _gguf_tensor(values, GGML.Q8_0)
    qs, scale = _q8_0_parts(tensor)  # type: ignore[arg-type]
    weight = dequantize_q8_0(qs, scale)
    linear = Q8Linear(*interleave_q8_0(qs, scale), kernel=kernels)
    x = torch.randn(rows, 96)
    torch.testing.assert_close(linear.mm(x), x @ weight.t(), rtol=1e-5, atol=1e-4)
    ids = torch.tensor([63, 0, 17])
    assert torch.equal(linear.rows(ids), weight[ids])


@pytest.mark.parametrize(
    "lengths",
    [[2200], [17], [700, 700, 700], [1, 300], [16, 33, 129, 5, 260, 1, 48, 97, 150, 2, 3, 4, 5, 6, 7, 8]],
)
def test_decode_attention_matches_sdpa_over_each_rows_pages(kernels: CpuKernels, lengths: list[int]) -> None:
    heads, kv_heads, dim, page_size = 9, 3, 64, 16
    needed = [-(-n // page_size) for n in lengths]
    pool_k = torch.randn(kv_heads, sum(needed) + 8, page_size, dim)
    pool_v = torch.randn(kv_heads, sum(needed) + 8, page_size, dim)
    # Scattered page tables: runs of consecutive pages broken at random, as a busy pool leaves them.
    order = torch.randperm(pool_k.shape[1], generator=torch.Generator().manual_seed(len(lengths))).tolist()
    tables, taken = [], 0
    for count in needed:
        pages = sorted(order[taken : taken + count]) if count % 2 else order[taken : taken + count]
        tables.append(pages)
        taken += count
    plan = segments(list(zip(tables, lengths, strict=True)), page_size)
    q = torch.randn(len(lengths), heads, dim)
    out = kernels.decode_attention(q, pool_k, pool_v, plan)
    for row, (pages, tokens) in enumerate(zip(tables, lengths, strict=True)):
        keys = by_token(pool_k)[pages].reshape(-1, kv_heads, dim)[:tokens].transpose(0, 1).unsqueeze(0)
        values = by_token(pool_v)[pages].reshape(-1, kv_heads, dim)[:tokens].transpose(0, 1).unsqueeze(0)
        expected = F.scaled_dot_product_attention(
            q[row].unsqueeze(1).unsqueeze(0), keys, values, enable_gqa=True
        )
        torch.testing.assert_close(out[row], expected.reshape(heads * dim))


def test_decode_attention_over_a_shared_prefix_equals_each_row_alone(kernels: CpuKernels) -> None:
    """Rows on one cached prefix share its stretches (one unit of work for all of them); each row's
    result is bit for bit what it gets attended on its own."""
    heads, kv_heads, dim, page_size = 9, 3, 64, 16
    pool_k, pool_v = torch.randn(kv_heads, 120, page_size, dim), torch.randn(kv_heads, 120, page_size, dim)
    prefix = list(range(10, 74))  # 1,024 tokens: 8 shared stretches of 128
    tables = [[*prefix, 80 + 3 * row, 81 + 3 * row] for row in range(7)]  # each row's own 2 pages
    lengths = [1024 + 5 + 4 * row for row in range(7)]
    contexts = list(zip(tables, lengths, strict=True))
    q = torch.randn(len(tables), heads, dim)
    together = kernels.decode_attention(q, pool_k, pool_v, segments(contexts, page_size))
    for row, context in enumerate(contexts):
        alone = kernels.decode_attention(q[row : row + 1], pool_k, pool_v, segments([context], page_size))
        assert torch.equal(together[row], alone[0])
    keys = by_token(pool_k)[tables[2]].reshape(-1, kv_heads, dim)[: lengths[2]].transpose(0, 1).unsqueeze(0)
    values = by_token(pool_v)[tables[2]].reshape(-1, kv_heads, dim)[: lengths[2]].transpose(0, 1).unsqueeze(0)
    expected = F.scaled_dot_product_attention(q[2].unsqueeze(1).unsqueeze(0), keys, values, enable_gqa=True)
    torch.testing.assert_close(together[2], expected.reshape(heads * dim))


def test_decode_attention_refuses_a_head_dimension_it_does_not_handle(kernels: CpuKernels) -> None:
    pool = torch.randn(2, 16, 2, 32)
    with pytest.raises(RuntimeError, match="bad shape"):
        kernels.decode_attention(torch.randn(1, 4, 32), pool, pool, segments([([0], 10)], 16))


# (chunk rows, context tokens): one row, partial and whole units of 4 rows, a chunk that is its whole
# context, and one over a long prefix with a partial last block of 16 keys.
@pytest.mark.parametrize(("rows", "tokens"), [(1, 1), (3, 40), (9, 9), (64, 300), (130, 1000)])
def test_prefill_attention_matches_sdpa_with_a_causal_chunk(
    kernels: CpuKernels, rows: int, tokens: int
) -> None:
    heads, kv_heads, dim, page_size = 9, 3, 64, 16
    pages = tokens // page_size + 3
    keys, values = torch.randn(kv_heads, pages, page_size, dim), torch.randn(kv_heads, pages, page_size, dim)
    context = torch.randperm(pages * page_size)[:tokens].to(torch.int32)  # slots in any order
    q = torch.randn(rows, heads, dim)
    got = kernels.prefill_attention(q, keys, values, context)
    k = keys.view(kv_heads, -1, dim)[:, context.long()].repeat_interleave(3, dim=0)
    v = values.view(kv_heads, -1, dim)[:, context.long()].repeat_interleave(3, dim=0)
    visible = torch.arange(tokens)[None, :] <= (tokens - rows + torch.arange(rows))[:, None]
    expected = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=visible)
    torch.testing.assert_close(got, expected.transpose(0, 1).reshape(rows, heads * dim), rtol=1e-5, atol=1e-5)


def test_context_slots_list_the_prefix_then_the_chunk() -> None:
    pages = torch.tensor([9, 2])
    prefix = PrefixPlan(
        runs=[PageRun(first_page=4, tokens=20)],
        scattered=ScatteredPages(pages, 18, pool_rows(pages, kv_heads=1, pool_pages=16)),
    )
    slots = context_slots(prefix, torch.tensor([50, 51, 7]), page_size=16)
    expected = [*range(64, 84), *range(144, 160), 32, 33, 50, 51, 7]
    assert slots.dtype == torch.int32 and slots.tolist() == expected
    assert context_slots(None, torch.tensor([3, 4]), page_size=16).tolist() == [3, 4]


def test_prefill_attention_refuses_shapes_it_does_not_handle(kernels: CpuKernels) -> None:
    pool = torch.randn(2, 16, 2, 32)
    with pytest.raises(ValueError, match="shapes"):
        kernels.prefill_attention(torch.randn(3, 4, 32), pool, pool, torch.arange(10, dtype=torch.int32))
    wide = torch.randn(1, 2, 16, 64)  # 13 query heads on one KV head: more than a unit's 12 queries
    with pytest.raises(ValueError, match="shapes"):
        kernels.prefill_attention(torch.randn(3, 13, 64), wide, wide, torch.arange(10, dtype=torch.int32))


def test_rms_norm_matches_the_torch_formula(kernels: CpuKernels) -> None:
    x, weight = torch.randn(3, 576), torch.rand(576)
    torch.testing.assert_close(kernels.rms_norm(x, weight, 1e-5), _rms_norm(x, weight, 1e-5))


def test_rope_store_rotates_q_and_k_and_writes_k_and_v_to_their_slots(kernels: CpuKernels) -> None:
    heads, kv_heads, dim, rows = 9, 3, 64, 37
    generator = torch.Generator().manual_seed(3)
    wide = torch.randn(rows, (heads + 2 * kv_heads) * dim + 5, generator=generator)
    qkv = wide[:, : (heads + 2 * kv_heads) * dim]  # a row stride wider than the row, as a view
    positions = torch.randint(0, 500, (rows,), generator=generator)
    slots = torch.randperm(8 * 16, generator=generator)[:rows]
    angles = torch.arange(512, dtype=torch.float32)[:, None] * (1e4 ** -(torch.arange(0, dim, 2) / dim))
    cos_half, sin_half = angles.cos(), angles.sin()
    keys, values = torch.zeros(kv_heads, 8, 16, dim), torch.zeros(kv_heads, 8, 16, dim)

    q = kernels.rope_store(qkv, heads, positions, cos_half, sin_half, keys, values, slots)

    heads_of = qkv.view(rows, heads + 2 * kv_heads, dim)
    cos = torch.cat([cos_half[positions]] * 2, dim=-1).unsqueeze(1)
    sin = torch.cat([-sin_half[positions], sin_half[positions]], dim=-1).unsqueeze(1)
    rotated = heads_of[:, : heads + kv_heads] * cos + heads_of[:, : heads + kv_heads].roll(dim // 2, -1) * sin
    torch.testing.assert_close(q, rotated[:, :heads])
    torch.testing.assert_close(keys.view(kv_heads, -1, dim)[:, slots].transpose(0, 1), rotated[:, heads:])
    assert torch.equal(
        values.view(kv_heads, -1, dim)[:, slots].transpose(0, 1), heads_of[:, heads + kv_heads :]
    )
    untouched = torch.ones(8 * 16, dtype=torch.bool)
    untouched[slots] = False
    assert not keys.view(kv_heads, -1, dim)[:, untouched].any()


def test_swiglu_matches_torch(kernels: CpuKernels) -> None:
    gate_up = torch.randn(70, 2 * 1536) * 6  # wide enough to reach both tails of the sigmoid
    gate_up[0, :4] = torch.tensor([0.0, -100.0, 100.0, -0.0])
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.swiglu(gate_up), F.silu(gate) * up)
    with pytest.raises(ValueError, match="swiglu"):
        kernels.swiglu(torch.zeros(2, 40))


def test_no_compiler_means_no_kernel_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert kernels_module.load_kernel.__wrapped__(tmp_path) is None


def test_a_built_kernel_is_reused_from_the_cache(tmp_path: Path) -> None:
    """The native build (built, and cached, on any x86-64 host; loaded only where the CPU runs it)."""
    first = kernels_module.load_kernel.__wrapped__(tmp_path)
    built = list((tmp_path / kernels_module.KERNEL_DIR).glob("cpu_kernels-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    second = kernels_module.load_kernel.__wrapped__(tmp_path)
    assert built[0].stat().st_mtime_ns == stamp
    assert (first is not None) == (second is not None) == avx512f()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the C kernels are x86-64 code")
def test_the_native_build_runs_only_on_avx512_cpus_and_the_portable_one_anywhere() -> None:
    assert (kernels_module.load_kernel.__wrapped__(KERNEL_CACHE) is not None) == avx512f()
    assert kernels_module.load_kernel.__wrapped__(KERNEL_CACHE, portable=True) is not None
    assert list((KERNEL_CACHE / kernels_module.KERNEL_DIR).glob("cpu_kernels-portable-*.so"))


def test_the_portable_build_is_refused_without_simdes_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "simde_py", None)  # `import simde_py` raises ImportError
    assert kernels_module.load_kernel.__wrapped__(tmp_path, portable=True) is None
    assert not (tmp_path / kernels_module.KERNEL_DIR).exists()


def test_an_installed_wheel_carries_the_sources_the_kernels_compile() -> None:
    """Without them in the package data, a non-editable install (the Docker image's) builds no
    kernel and serves torch's path even on an AVX-512 host."""
    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["adapters.local"]
    assert sorted(shipped) == sorted([kernels_module.SOURCE.name, kernels_module.PORTABLE_HEADER.name])


def avx512f() -> bool:
    """Whether /proc/cpuinfo lists AVX-512F (the native build's own test is `__builtin_cpu_supports`)."""
    return "avx512f" in kernels_module.cpu_flags().split()
