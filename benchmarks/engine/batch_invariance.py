"""Which ops of the torch path give a row the same bits whatever shares its call: the diagnostic
behind `test_stock_linear.py`'s near-tie rule (`benchmarks/results/engine_quantized.md`).

Each check runs one op on rows alone and inside a bigger call (or with its context cut
differently) and prints whether the rows' results are bitwise equal and the largest difference;
then it times what making prompt-row products row-invariant would cost (`blocked_cost`).

    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.batch_invariance
    # a host without AVX-512 (torch's and MKL's AVX2 code):
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.batch_invariance
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import torch

from adapters.local.attention import _flash_with_lse, _merge
from adapters.local.model import _fused_rms_norm, _rms_norm

PROMPT_ROWS = 512
LAYER_SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))  # one layer's products, [in, out]
HIDDEN, KV_HEADS, GROUPS, HEAD_DIM, CONTEXT = 576, 3, 3, 64, 400  # SmolLM2-135M's attention shapes


def _report(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    difference = float((got - want).abs().max())
    print(f"{name:<58} {'equal' if torch.equal(got, want) else 'DIFFERS'}  max |d| {difference:.2e}")


def _best_ms(step: Callable[[], None], repeats: int) -> float:
    step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def blocked_cost(threads: int) -> None:
    """What fixed-size MKL calls (the only way to give a prompt row the same bits whatever chunk or
    batch holds it, where MKL's blocking depends on the call's rows) cost a 512-row chunk's layer."""
    torch.set_num_threads(threads)
    pairs = [(torch.randn(PROMPT_ROWS, k), torch.randn(k, n)) for k, n in LAYER_SHAPES]

    def blocks(size: int) -> None:
        for x, w in pairs:
            for start in range(0, PROMPT_ROWS, size):
                x[start : start + size] @ w

    whole = _best_ms(lambda: blocks(PROMPT_ROWS), 20)
    print(f"one layer's 4 products of {PROMPT_ROWS} rows, {threads} threads: one call {whole:.2f} ms")
    for size, repeats in ((16, 20), (1, 3)):
        ms = _best_ms(partial(blocks, size), repeats)
        print(f"  in calls of {size:>2} rows: {ms:.2f} ms ({ms / whole:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="threads for the cost measurement")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, ATen code {torch.backends.cpu.get_cpu_capability()}")
    x, weight = torch.randn(7, HIDDEN), torch.randn(HIDDEN)
    rows = torch.stack([_rms_norm(x[i : i + 1], weight, 1e-5)[0] for i in range(7)])
    _report("RMSNorm (six ops): 1 row vs 7 rows", rows, _rms_norm(x, weight, 1e-5))
    _report("RMSNorm: F.rms_norm vs six ops", _fused_rms_norm(x, weight, 1e-5), _rms_norm(x, weight, 1e-5))
    w = torch.randn(HEAD_DIM, HIDDEN)
    q = torch.randn(64, HEAD_DIM)
    _report("MKL x @ w: row 0 of 1 row vs of 2 rows", (q[:1] @ w)[0], (q[:2] @ w)[0])
    _report(
        "MKL x @ w: rows of 2..63-row calls vs a 64-row call",
        torch.cat([(q[:m] @ w)[:m] for m in range(2, 64)]),
        torch.cat([(q @ w)[:m] for m in range(2, 64)]),
    )
    keys, values = torch.randn(1, KV_HEADS, CONTEXT, HEAD_DIM), torch.randn(1, KV_HEADS, CONTEXT, HEAD_DIM)
    folded = torch.randn(1, KV_HEADS, 36, HEAD_DIM)  # 12 decode rows x 3 query heads per KV head
    every, _ = _flash_with_lse(folded, keys, values, causal=False)
    for count in (3, 33, 34):
        part, _ = _flash_with_lse(folded[:, :, :count], keys, values, causal=False)
        _report(f"flash: first {count} query rows alone vs in a 36-row call", part, every[:, :, :count])
    one = folded[:, :, :GROUPS]
    whole, _ = _flash_with_lse(one, keys, values, causal=False)
    cut = CONTEXT // 2
    parts = []
    for span in (slice(0, cut), slice(cut, CONTEXT)):
        o, part_lse = _flash_with_lse(one, keys[:, :, span], values[:, :, span], causal=False)
        parts.append((torch.tensor([0]), o.reshape(1, KV_HEADS * GROUPS, HEAD_DIM), part_lse.reshape(1, -1)))
    merged = _merge(1, parts)
    _report("flash: whole context vs two page runs merged", merged, whole.reshape(1, -1, HEAD_DIM))
    padded_keys = torch.cat([keys, torch.zeros(1, KV_HEADS, 112, HEAD_DIM)], dim=2)
    padded_values = torch.cat([values, torch.zeros(1, KV_HEADS, 112, HEAD_DIM)], dim=2)
    mask = torch.zeros(1, 1, 1, CONTEXT + 112)
    mask[..., CONTEXT:] = float("-inf")
    padded, _ = _flash_with_lse(one, padded_keys, padded_values, causal=False, mask=mask)
    _report("flash: context as is vs padded and masked (gathered rows)", padded, whole)
    blocked_cost(args.threads)


if __name__ == "__main__":
    main()
