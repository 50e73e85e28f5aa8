"""The KV pool's dtype (`kv_dtype`): half precision where torch's attention serves packed weights
(float16 only on CPUs with fp16 arithmetic), exact fp32 where the C kernels attend or the exact
mode runs, and a half pool on any path on request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from adapters.local import LocalEngine
from adapters.local.kv_pool import KV_DTYPES, KVPool, half_kv_dtype, kv_dtype
from adapters.local.loader import LoadedModel
from adapters.local.runner import ModelRunner
from tests.adapters.local.conftest import TEST_CONFIG, chat


def test_auto_is_half_only_where_torch_attends_packed_weights() -> None:
    assert kv_dtype("auto", torch.float32, torch_attends_packed=True) == KV_DTYPES[half_kv_dtype()]
    assert kv_dtype("auto", torch.float32, torch_attends_packed=False) == torch.float32
    assert kv_dtype("auto", torch.bfloat16, torch_attends_packed=False) == torch.bfloat16
    assert kv_dtype("bfloat16", torch.float32, torch_attends_packed=False) == torch.bfloat16
    assert kv_dtype("float32", torch.float32, torch_attends_packed=True) == torch.float32


@pytest.mark.parametrize(("fp16_arithmetic", "expected"), [(True, "float16"), (False, "bfloat16")])
def test_the_half_type_is_float16_only_with_fp16_arithmetic(
    monkeypatch: pytest.MonkeyPatch, fp16_arithmetic: bool, expected: str
) -> None:
    """Without fp16 arithmetic torch's attention converts float16 slowly (1.8x a step, measured):
    such CPUs take bfloat16."""
    probe = SimpleNamespace(_is_mkldnn_fp16_supported=lambda: fp16_arithmetic)
    monkeypatch.setattr(torch.ops, "mkldnn", probe)
    assert half_kv_dtype() == expected


def test_a_missing_or_failing_probe_means_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails() -> bool:
        raise RuntimeError("no oneDNN in this build")

    monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace(_is_mkldnn_fp16_supported=fails))
    assert half_kv_dtype() == "bfloat16"
    monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace())
    assert half_kv_dtype() == "bfloat16"


def test_kv_dtype_is_checked() -> None:
    with pytest.raises(ValueError, match="kv_dtype"):
        replace(TEST_CONFIG, kv_dtype="int8").validate()  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("half_type", ["float16", "bfloat16"])
async def test_a_half_pool_answers_on_any_path(
    make_engine: Callable[..., LocalEngine], loaded: LoadedModel, half_type: str
) -> None:
    """A half pool under the exact weights (the C kernels multiply where they run; torch's
    flash kernel attends, as they read fp32 pages only): half the bytes a token, the same answer,
    and a repeat served from its cached half pages says it again."""
    exact, half = make_engine(), make_engine(kv_dtype=half_type)
    runner = ModelRunner(loaded.model, KVPool(loaded.spec, 4, 16, KV_DTYPES[half_type]))
    assert not loaded.model.kernel_attends(runner.pool)
    for _ in range(2):  # the second request reads its prompt's pages from the prefix cache
        answer = await half.complete(chat("What is the capital of France?", temperature=0))
        assert "Paris" in answer.body.decode()
    await exact.complete(chat("What is the capital of France?", temperature=0))
    exact_stats, half_stats = exact.stats(), half.stats()
    assert exact_stats is not None and half_stats is not None
    assert half_stats.cache_hit_tokens > 0
    assert half_stats.kv_bytes_per_token * 2 == exact_stats.kv_bytes_per_token


@pytest.mark.parametrize(
    ("half_type", "atol", "rtol"), [(torch.float16, 4e-3, 2e-3), (torch.bfloat16, 1e-2, 8e-3)]
)
def test_keys_shift_in_a_half_pool_as_in_fp32(
    loaded: LoadedModel, half_type: torch.dtype, atol: float, rtol: float
) -> None:
    """A sliding window moves stored keys back (`shift_keys`): in a half pool they are rotated in
    fp32 and rounded once, so they stay within a half type's rounding of the fp32 pool's (float16
    keeps 11 significant bits, bfloat16 8)."""
    pools = {dtype: KVPool(loaded.spec, 3, 16, dtype) for dtype in (torch.float32, half_type)}
    keys = torch.randn(pools[torch.float32].k.shape, generator=torch.Generator().manual_seed(0))
    for pool in pools.values():
        pool.k.copy_(keys)
        loaded.model.shift_keys(pool, [0, 2], 37)
    exact, half = pools[torch.float32].k, pools[half_type].k.float()
    assert torch.equal(half[:, :, 1], keys[:, :, 1].to(half_type).float())  # untouched page
    assert not torch.allclose(exact[:, :, 0], keys[:, :, 0], atol=0.1)  # really rotated
    torch.testing.assert_close(half, exact, atol=atol, rtol=rtol)
