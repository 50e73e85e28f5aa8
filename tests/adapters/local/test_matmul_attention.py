"""Decode attention over one run by two matmuls (`matmul_attention`) against the flash kernel in
windows, on every host, and where each is chosen."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from adapters.local import LocalEngineConfig, matmul_attention
from adapters.local import model as model_module
from adapters.local.attention import run_windows, windowed_attention
from adapters.local.attention_plan import PageRun
from adapters.local.kv_pool import KVPool
from adapters.local.loader import LoadedModel, load_model
from adapters.local.matmul_attention import matmul_attends, native_bf16_matmul, run_matmul_attention
from adapters.local.runner import ModelRunner
from adapters.local.sampling import SamplerState, SamplingParams
from adapters.local.scheduler import ScheduledStep
from adapters.local.sequence import GenerationJob, Sequence
from adapters.local.text_stream import TextStream

LAYERS, KV_HEADS, HEADS, PAGES, PAGE, DIM = 2, 3, 9, 40, 16, 64


def pool(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A head-major pool as `KVPool` lays it out: `[layers, kv_heads, pages, page_size, d]`."""
    gen = torch.Generator().manual_seed(0)
    shape = (LAYERS, KV_HEADS, PAGES, PAGE, DIM)
    return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_matmuls_over_a_run_equal_the_flash_kernel_in_windows(
    rows: int, dtype: torch.dtype, tolerance: float
) -> None:
    """The same rows over the same run (pages 3.. with the first 5 slots hidden, as a slid window
    leaves it): the flash kernel in 1 and 4 windows, the matmuls on the run as one window."""
    k, v = pool(dtype)
    run = PageRun(first_page=3, tokens=30 * PAGE - 5, skip=5)
    q = torch.randn(rows, HEADS, DIM, generator=torch.Generator().manual_seed(1)).to(dtype)
    one = run_windows(k, v, run, 1)
    for layer in range(LAYERS):
        ours = run_matmul_attention(q, one.keys[layer], one.values[layer], one.mask).float()
        for count in (1, 4):
            windows = run_windows(k, v, run, count)
            flash = windowed_attention(q, windows.keys[layer], windows.values[layer], windows.mask).float()
            assert ours.shape == flash.shape == (rows, HEADS * DIM)
            torch.testing.assert_close(ours, flash, atol=tolerance, rtol=tolerance)


def test_matmuls_take_the_run_as_one_window() -> None:
    k, v = pool(torch.float32)
    windows = run_windows(k, v, PageRun(first_page=0, tokens=8 * PAGE), 2)
    with pytest.raises(ValueError, match="one window"):
        run_matmul_attention(torch.zeros(1, HEADS, DIM), windows.keys[0], windows.values[0], windows.mask)


def test_float32_pools_attend_by_matmuls_everywhere_float16_never() -> None:
    assert matmul_attends(torch.float32)
    assert not matmul_attends(torch.float16)
    assert matmul_attends(torch.bfloat16) == native_bf16_matmul()


@pytest.mark.parametrize(("probe", "expected"), [(lambda: True, None), (lambda: False, False)])
def test_bfloat16_matmuls_need_onednn_and_the_cpu(
    monkeypatch: pytest.MonkeyPatch, probe: object, expected: bool | None
) -> None:
    """oneDNN must allow bfloat16; on x86 the CPU must also have it natively (AVX512-BF16 or AMX)."""
    native_bf16_matmul.cache_clear()
    monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace(_is_mkldnn_bf16_supported=probe))
    for avx512_bf16, amx in ((False, False), (True, False), (False, True)):
        native_bf16_matmul.cache_clear()
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        want = expected if expected is not None else (avx512_bf16 or amx or not x86)
        assert native_bf16_matmul() is want
    native_bf16_matmul.cache_clear()


def test_a_build_without_onednn_keeps_the_flash_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails() -> bool:
        raise RuntimeError("no oneDNN in this build")

    native_bf16_matmul.cache_clear()
    monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace(_is_mkldnn_bf16_supported=fails))
    assert not native_bf16_matmul()
    monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace())
    native_bf16_matmul.cache_clear()
    assert not native_bf16_matmul()
    native_bf16_matmul.cache_clear()


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="ONEDNN_MAX_CPU_ISA=AVX2 is an x86 setting"
)
def test_avx2_code_keeps_bfloat16_on_the_flash_kernel() -> None:
    """With oneDNN held to AVX2 (a host without AVX-512), bfloat16 `bmm` is emulated: 40 ms a step
    against the flash kernel's 9, measured. Checked in a fresh process: the probe is read once."""
    code = f"import {matmul_attention.__name__} as m; print(m.native_bf16_matmul())"
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_step_gives_the_same_logits_by_either_path(
    monkeypatch: pytest.MonkeyPatch, tiny_model: tuple[LocalEngineConfig, LoadedModel], dtype: torch.dtype
) -> None:
    """One stream's decode step on torch's path (no C kernels), its pool in `dtype`: the matmuls
    and the flash kernel in windows give the same logits (the fallback runs on every host)."""
    config, _ = tiny_model
    loaded = load_model(replace(config, c_kernels=False))
    pool = KVPool(loaded.spec, 64, 16, dtype)
    runner = ModelRunner(loaded.model, pool)
    params = SamplingParams(max_tokens=4, temperature=0.0)
    ids = [(i * 7919) % loaded.spec.vocab_size for i in range(500)]
    job = GenerationJob(job_id=0, groups=[], params=params, salt="", sink=lambda events: None)
    seq = Sequence(
        job, ids, 0, SamplerState(params, loaded.spec.vocab_size, ids, 0), TextStream(loaded.tokenizer, ())
    )
    pages = pool.alloc(pool.num_pages)
    assert pages is not None
    seq.pages = pages
    runner.run(ScheduledStep(prefills=[(seq, len(ids) - 1)]))
    logits = {}
    for by_matmul in (True, False):
        monkeypatch.setattr(model_module, "matmul_attends", lambda _dtype, on=by_matmul: on)
        logits[by_matmul] = runner.run(ScheduledStep(decodes=[seq])).logits[0]
        seq.num_computed -= 1  # the same step again: it rewrites the same slot
    # bfloat16: within 1 % of the largest logit (a bfloat16 ulp there is 0.4-0.8 %).
    scale = float(logits[False].abs().max())
    tolerance = 0.01 * scale if dtype == torch.bfloat16 else 1e-5 * scale
    torch.testing.assert_close(logits[True], logits[False], atol=tolerance, rtol=0)
