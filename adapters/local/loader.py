"""Load a model once: weights in the serving dtype, the tokenizer and the chat template.

A `LoadedModel` is read-only after loading, so several engines (say, radix cache on and off in a
benchmark, or tests with different schedulers) can share one copy of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.local.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate
from adapters.local.checkpoint import default_model_path, load_checkpoint
from adapters.local.config import DType, LocalEngineConfig
from adapters.local.gguf_convert import ModelSpec
from adapters.local.model import LlamaModel
from adapters.local.tokenizer import TextTokenizer

TORCH_DTYPES: dict[DType, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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
    return LoadedModel(
        spec=checkpoint.spec, model=model, tokenizer=tokenizer, template=template, sha256=checkpoint.sha256
    )


def _token_text(tokenizer: TextTokenizer, token_id: int | None) -> str:
    if token_id is None:
        return ""
    return tokenizer.token_bytes[token_id].decode("utf-8", errors="replace")
