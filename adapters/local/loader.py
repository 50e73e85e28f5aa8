"""Load a model once: weights in the serving dtype, the tokenizer and the chat template.

A `LoadedModel` is read-only after loading, so several engines (say, radix cache on and off in a
benchmark, or tests with different schedulers) can share one copy of the weights.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from adapters.local.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate
from adapters.local.checkpoint import load_checkpoint
from adapters.local.config import DType, LocalEngineConfig, default_model_path
from adapters.local.gguf_convert import ModelSpec
from adapters.local.kernels import CpuKernels, load_kernel
from adapters.local.model import LlamaModel
from adapters.local.tokenizer import TextTokenizer

TORCH_DTYPES: dict[DType, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}

MMAP_THRESHOLD_BYTES = 32 << 20
"""Allocations at least this big get their own mapping, returned to the OS when freed (glibc's
largest allowed value). Every activation of a step is smaller, so it comes from the heap."""
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
"""Free memory at the heap's top that glibc keeps rather than return to the OS at each `free`: twice
the mmap threshold, glibc's own rule when it adapts both. Fixing the mmap threshold pins this one at
its 128 KB default, and then a step's freed activations, if they end at the heap's top, are unmapped
as they are freed and faulted in again by the next step: measured 196k page faults and 0.48 s of
system time per 16-row decode step (835 ms against 343) in a layout where that happened."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers, from glibc's malloc.h

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    """Weights, tokenizer and template of one model, ready to serve."""

    spec: ModelSpec
    model: LlamaModel
    tokenizer: TextTokenizer
    template: ChatTemplate
    sha256: str


def load_model(
    config: LocalEngineConfig, *, kernels: Callable[[Path], CpuKernels | None] = load_kernel
) -> LoadedModel:
    """Read (or convert and cache) `config.model_path` and build the model in `config.dtype`.
    `kernels` gives the C kernels from the cache directory (tests and benchmarks pass their
    portable build)."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    path = config.model_path if config.model_path is not None else default_model_path()
    checkpoint = load_checkpoint(path, config.resolved_cache_dir())
    tokenizer = TextTokenizer(checkpoint.tokenizer, checkpoint.special)
    template = ChatTemplate(
        source=checkpoint.special.chat_template or DEFAULT_CHAT_TEMPLATE,
        bos_token=_token_text(tokenizer, checkpoint.special.bos_id),
        eos_token=_token_text(tokenizer, checkpoint.special.eos_id),
    )
    dtype = TORCH_DTYPES[config.dtype]
    kernel = None
    if config.c_kernels and dtype == torch.float32:
        kernel = kernels(config.resolved_cache_dir())
    model = LlamaModel(
        checkpoint.spec, checkpoint.tensors, dtype, kernel, config.prefill_activations, config.decode_weights
    )
    loaded = LoadedModel(
        spec=checkpoint.spec, model=model, tokenizer=tokenizer, template=template, sha256=checkpoint.sha256
    )
    del checkpoint  # in another dtype than the file's, the originals go before the heap is trimmed
    tune_allocator()
    return loaded


def tune_allocator() -> None:
    """Keep activations on the heap during a step and resident memory close to what is live
    between steps (glibc only; elsewhere a no-op).

    A prefill step allocates hundreds of activations of 1-3 MB. Mapped one by one (a 1 MB mmap
    threshold), each is faulted in page by page and unmapped when freed: measured 560-620k page
    faults per cold 2,176-token prefill (58-65k now), ~1.1 us each on the dev box's KVM guest, so
    ~0.6 s of CPU. From the heap they reuse the memory the previous layer freed. glibc's default
    threshold adapts upward by itself, but then freed activations stay resident, fragmented (57 MB
    after a 2,048-token chunk); so the threshold is fixed and `release_heap` returns the heap's free
    pages after each prefill step (`TRIM_THRESHOLD_BYTES` keeps a decode step's from being returned
    at every free). `malloc_trim` here also hands back what loading the tokenizer freed (~26 MB)."""
    libc = _libc()
    if libc is None:
        return
    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    libc.malloc_trim(0)


def release_heap() -> None:
    """Return the free pages of every malloc arena to the OS (glibc `malloc_trim`; elsewhere a no-op).
    Called after steps that prefilled, whose activations are the largest the engine allocates. glibc
    shrinks only the main arena's top this way; the engine thread's arena keeps up to
    `TRIM_THRESHOLD_BYTES` free at its top (21-39 MiB measured after 512-token chunks, 2026-12-07).
    Trimming that top too (the threshold lowered around one large `free`) did not lower the peak: the
    next chunk grows the arena back to the same size."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018 - glibc has both; other C libraries may lack them
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        logger.debug("allocator tuning unavailable (not glibc)")
        return None
    return libc


def _token_text(tokenizer: TextTokenizer, token_id: int | None) -> str:
    if token_id is None:
        return ""
    return tokenizer.token_bytes[token_id].decode("utf-8", errors="replace")
