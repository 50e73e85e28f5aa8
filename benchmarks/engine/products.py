"""The weight products of one SmolLM2-135M step through each candidate, side by side in one process.

A step multiplies its rows by 120 layer matrices (30 layers x wqkv 960x576, wo 576x576, w_gate_up
3072x576, w_down 576x1536) and the tied head (49,152 x 576) for the rows that give logits. Each
candidate holds 30 distinct copies of the layer matrices, so the weights stream from memory as in
the engine. Candidates: fp32 (MKL), torch's `_weight_int4pack_mm_for_cpu` (groups of 32, as Q4_1)
and `_weight_int8pack_mm` (per output channel), with bf16 activations (their fp32 paths are
scalar code on x86: 0.9 s for one row's 120 products here), `torch._int_mm` on int8 rows, torch's
dynamic int8 linear (`quantized.linear_dynamic`, fbgemm or qnnpack), and the C kernels where they
build (exact Q4_1/Q8_0, and VNNI int8 activations), and onnxruntime's `MatMulNBits` where it is
installed (`ort_candidate`).

    .venv/bin/python -m benchmarks.engine.products --threads 2
    # torch's and MKL's AVX2 code on an AVX-512 host (what a host without AVX-512 runs):
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 \\
        .venv/bin/python -m benchmarks.engine.products --no-c
    # the dense prompt copies alone (emulated bfloat16 takes minutes at 512 rows):
    .venv/bin/python -m benchmarks.engine.products --no-c --rows 16 64 512 --only MKL fp16
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from adapters.local.kernels import load_kernel
from adapters.local.linear import GROUP, interleave_q4_1, interleave_q4_1_vnni, interleave_q8_0
from benchmarks.engine import ort_candidate

LAYERS = 30
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
HEAD = (49152, 576)
GROUP_SIZE = 32
Product = Callable[[torch.Tensor], torch.Tensor]


def _q4(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q4_1 parts: `q` [n, k] in 0..15, `scale`, `offset` [n, k/32]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, k // GROUP_SIZE, generator=g) * 0.01 + 0.001
    offset = -8 * scale
    return q, scale, offset


def _dense(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    s = scale.repeat_interleave(GROUP_SIZE, 1)
    return q.float() * s + offset.repeat_interleave(GROUP_SIZE, 1)


def _int4(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, GROUP_SIZE, scales_zeros)


def _int8(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int8pack_mm(x.bfloat16(), weight, scales)


def _int8_product(dense: torch.Tensor) -> Product:
    weight, scales = _per_channel(dense)
    return partial(_int8, weight=weight, scales=scales)


def _int8_dynamic(x: torch.Tensor, weight_t: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """int8 activations (per row) times int8 weights (per output) in `torch._int_mm`: what
    torchao's int8 dynamic-activation config runs on CPU."""
    row_scale = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
    q = torch.round(x / row_scale).to(torch.int8)
    return torch._int_mm(q, weight_t) * row_scale * scales


def _int8_dynamic_product(dense: torch.Tensor) -> Product:
    weight, scales = _per_channel(dense)
    return partial(_int8_dynamic, weight_t=weight.t().contiguous(), scales=scales.float())


def _fbgemm_dynamic(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = torch.ops.quantized.linear_dynamic(x, packed, True)
    return out


def _fbgemm_product(dense: torch.Tensor) -> Product:
    """torch's stock dynamic int8 linear (`quantized.linear_dynamic`: activations quantized per call,
    int8 weights per output channel, fp32 in and out) in the quantized engine torch picks for the
    host (fbgemm on x86, which dispatches on `FBGEMM_ENABLE_INSTRUCTIONS`; qnnpack on ARM)."""
    scale = dense.abs().amax(1).clamp(min=1e-12) / 127
    zero = torch.zeros(dense.shape[0], dtype=torch.int64)
    weight = torch.quantize_per_channel(dense, scale.double(), zero, 0, torch.qint8)
    return partial(_fbgemm_dynamic, packed=torch.ops.quantized.linear_prepack(weight, None))


def _fbgemm_fp16(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = torch.ops.quantized.linear_dynamic_fp16(x, packed)
    return out


def _fbgemm_fp16_product(dense: torch.Tensor) -> Product:
    """fbgemm's fp16-weight linear (`quantized.linear_dynamic_fp16`): weights stored as fp16,
    fp32 activations as they are (nothing quantized per call, so a row's result is its own)."""
    return partial(_fbgemm_fp16, packed=torch.ops.quantized.linear_prepack_fp16(dense, None))


def _mkl(x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    return x @ weight_t


def _bf16_dense(x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    return (x.to(torch.bfloat16) @ weight_t).float()


def _per_channel(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`dense` [n, k] as int8 [n, k] and bf16 scales [n] (max |w| / 127 per output)."""
    scale = dense.abs().amax(1).clamp(min=1e-12) / 127
    return torch.round(dense / scale[:, None]).to(torch.int8).contiguous(), scale.bfloat16()


def _c_product(
    kernel: Callable[..., None], weights: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor
) -> Product:
    def product(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], weights.shape[0] * GROUP)
        kernel(x, weights, scale, offset, out, accumulate=False)
        return out

    return product


def candidates(kernels_dir: Path | None, threads: int) -> dict[str, list[Product]]:
    """Name -> one product per layer matrix (LAYERS x SHAPES)."""
    parts = [_q4(n, k, seed) for seed in range(LAYERS) for n, k in SHAPES]
    dense = [_dense(*p) for p in parts]
    out: dict[str, list[Product]] = {
        "fp32 (MKL)": [partial(_mkl, weight_t=w.t().contiguous()) for w in dense]
    }
    out["bf16 dense (oneDNN), bf16 x"] = [
        partial(_bf16_dense, weight_t=w.t().contiguous().bfloat16()) for w in dense
    ]
    # fp32 activations run scalar code on x86 in both torch ops (their vector paths take bf16).
    int4 = []
    for q, scale, offset in parts:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        zeros = offset + 8 * scale  # the op computes (q - 8) * scale + zero
        scales_zeros = torch.stack([scale.t(), zeros.t()], dim=-1).bfloat16().contiguous()
        int4.append(partial(_int4, packed=packed, scales_zeros=scales_zeros))
    out["int4pack, bf16 x"] = int4
    out["int8pack, bf16 x"] = [_int8_product(w) for w in dense]
    out["int8 x int8, torch._int_mm"] = [_int8_dynamic_product(w) for w in dense]
    out[f"int8 dynamic, {torch.backends.quantized.engine}"] = [_fbgemm_product(w) for w in dense]
    out["fp16 weights, fbgemm"] = [_fbgemm_fp16_product(w) for w in dense]
    if ort_candidate.available():
        out["onnxruntime MatMulNBits, int8 x"] = [
            ort_candidate.matmul_nbits(q, scale, threads) for q, scale, _ in parts
        ]
    kernels = load_kernel(kernels_dir) if kernels_dir is not None else None
    if kernels is not None:
        exact, vnni = [], []
        for q, scale, offset in parts:
            n, k = q.shape
            halves = q.view(n, k // 32, 2, 16)
            packed, sc, of = interleave_q4_1(
                (halves[:, :, 0] | (halves[:, :, 1] << 4)).view(n, -1), scale, offset
            )
            exact.append(_c_product(kernels.matmul, packed, sc, of))
            vnni.append(_c_product(kernels.matmul_int8, interleave_q4_1_vnni(packed), sc, of))
        out["C q4_1 exact (AVX-512)"] = exact
        if kernels.vnni:
            out["C q4_1 int8 x (VNNI)"] = vnni
    return out


def heads(kernels_dir: Path | None) -> dict[str, Product]:
    n, k = HEAD
    g = torch.Generator().manual_seed(99)
    q8 = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    block_scale = torch.rand(n, k // 32, generator=g) * 0.001
    dense = q8.float() * block_scale.repeat_interleave(32, 1)
    out: dict[str, Product] = {
        "fp32 (MKL)": partial(_mkl, weight_t=dense.t().contiguous()),
        "int8pack, bf16 x": _int8_product(dense),
        f"int8 dynamic, {torch.backends.quantized.engine}": _fbgemm_product(dense),
        "fp16 weights, fbgemm": _fbgemm_fp16_product(dense),
    }
    kernels = load_kernel(kernels_dir) if kernels_dir is not None else None
    if kernels is not None:
        packed, scale = interleave_q8_0(q8, block_scale)
        out["C q8_0 exact (AVX-512)"] = partial(kernels.q8_matmul, packed=packed, scale=scale)
    return out


def _pass(products: list[Product], inputs: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    for product, x in zip(products, inputs, strict=True):
        product(x)
    return (time.perf_counter() - start) * 1000


def compare(sets: dict[str, list[Product]], widths: list[int], rows: int, rounds: int) -> dict[str, float]:
    """Median ms of one pass over each set's products on `rows` random rows, the sets taking turns
    pass by pass (on a shared machine load comes and goes; turns spread it over all of them)."""
    by_width = {k: torch.randn(rows, k) for k in set(widths)}
    inputs = [by_width[k] for k in widths]
    samples: dict[str, list[float]] = {name: [] for name in sets}
    with torch.inference_mode():
        for products in sets.values():  # warm-up
            _pass(products, inputs)
        for _ in range(rounds):
            for name, products in sets.items():
                samples[name].append(_pass(products, inputs))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 512])
    parser.add_argument("--no-c", action="store_true", help="leave out the C kernels")
    parser.add_argument(
        "--only", nargs="+", metavar="TEXT", help="only candidates whose name holds one of these"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    with tempfile.TemporaryDirectory() as tmp:
        where = None if args.no_c else Path(tmp)
        layer_products, head_products = candidates(where, args.threads), heads(where)
    if args.only:
        layer_products = {n: p for n, p in layer_products.items() if any(t in n for t in args.only)}
        head_products = {n: p for n, p in head_products.items() if any(t in n for t in args.only)}
    widths = [k for _ in range(LAYERS) for _, k in SHAPES]
    columns = {r: compare(layer_products, widths, r, args.rounds if r < 512 else 3) for r in args.rows}
    print(f"\n120 layer products, ms (median of {args.rounds} rounds; 512 rows: 3)\n")
    print("| candidate | " + " | ".join(f"{r} rows" for r in args.rows) + " |")
    print("|---|" + "---|" * len(args.rows))
    for name in layer_products:
        print(f"| {name} | " + " | ".join(f"{columns[r][name]:.1f}" for r in args.rows) + " |")
    head_sets = {name: [product] for name, product in head_products.items()}
    head_columns = {r: compare(head_sets, [HEAD[1]], r, args.rounds) for r in (1, 16)}
    print("\nhead 49,152 x 576, ms\n")
    print("| candidate | 1 row | 16 rows |\n|---|---|---|")
    for name in head_products:
        print(f"| {name} | {head_columns[1][name]:.2f} | {head_columns[16][name]:.2f} |")


if __name__ == "__main__":
    main()
