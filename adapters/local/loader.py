"""Load a model once: weights in the serving dtype, the tokenizer and the chat template.

A `LoadedModel` is read-only after loading, so several engines (say, radix cache on and off in a
benchmark, or tests with different schedulers) can share one copy of the weights.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from dataclasses import dataclass

import torch

from adapters.local.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate
from adapters.local.checkpoint import load_checkpoint
from adapters.local.config import DType, LocalEngineConfig, default_model_path
from adapters.local.gguf_convert import ModelSpec
from adapters.local.model import LlamaModel
from adapters.local.tokenizer import TextTokenizer

TORCH_DTYPES: dict[DType, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}

MMAP_THRESHOLD_BYTES = 1 << 20
"""Allocations at least this big get their own mapping, returned to the OS when freed (glibc)."""
_M_MMAP_THRESHOLD = -3  # mallopt parameter number, from glibc's malloc.h

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    """Weights, tokenizer and template of one model, ready to serve."""

    spec: ModelSpec
    model: LlamaModel
    tokenizer: TextTokenizer
    template: ChatTemplate
    sha256: str


def load_model(config: LocalEngineConfig) -> LoadedModel:
    """Read (or convert and cache) `config.model_path` and build the model in `config.dtype`."""
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
    model = LlamaModel(checkpoint.spec, checkpoint.tensors, TORCH_DTYPES[config.dtype])
    loaded = LoadedModel(
        spec=checkpoint.spec, model=model, tokenizer=tokenizer, template=template, sha256=checkpoint.sha256
    )
    del checkpoint  # in another dtype than the file's, the originals go before the heap is trimmed
    tune_allocator()
    return loaded


def tune_allocator() -> None:
    """Keep resident memory close to what is live (glibc only; elsewhere a no-op).

    A prefill step's activations are a few MB each. glibc's default mmap threshold adapts upward
    to such sizes, after which freed activations stay in the heap, fragmented: measured on a
    2,048-token chunk, the process held 57 MB more after the step than before it (12 MB with the
    fixed threshold) and peaked 20 MB higher within it. A fixed 1 MB threshold maps each big
    tensor on its own and unmaps it when freed. `malloc_trim` then hands back what loading the
    tokenizer freed (~26 MB)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        logger.debug("allocator tuning unavailable (not glibc)")


def _token_text(tokenizer: TextTokenizer, token_id: int | None) -> str:
    if token_id is None:
        return ""
    return tokenizer.token_bytes[token_id].decode("utf-8", errors="replace")
