"""The embedded CPU engine: a Llama-family GGUF in our own PyTorch forward pass, with a paged KV
pool, radix prefix reuse (SGLang's RadixAttention) and continuous batching.

    checkpoint / gguf_convert   GGUF -> fp32 tensors (+ a safetensors cache keyed by sha256)
    loader                      weights, tokenizer and template, loaded once, shareable
    tokenizer / chat_template   the vocabulary and prompt format from GGUF metadata
    model / attention / kv_pool the forward pass over fixed-size KV pages (no page copies)
    prefix_cache                the radix tree of cached pages (cachelayer.radix)
    offload*                    evicted pages to memory/disk and back (cachelayer.tiers)
    scheduler / runner / core   continuous batching on the engine thread
    sampling / text_stream      next-token choice, stop strings, UTF-8-safe text
    prepare / openai_format     OpenAI request in, OpenAI body or chunks out
    engine                      `LocalEngine`, the async `Engine` the gateway calls
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adapters.local.config import LocalEngineConfig

if TYPE_CHECKING:
    from adapters.local.core import EngineStats
    from adapters.local.engine import LocalEngine

__all__ = ["EngineStats", "LocalEngine", "LocalEngineConfig", "create_local_engine"]


def create_local_engine(config: LocalEngineConfig | None = None) -> LocalEngine:
    """A `LocalEngine` for `config` (defaults: the bundled SmolLM2); call `await engine.start()`."""
    from adapters.local.engine import LocalEngine

    return LocalEngine(config or LocalEngineConfig())


def __getattr__(name: str) -> Any:
    # torch is imported on first use of the engine, not by `adapters.local.config` (the gateway's
    # settings import it; a gateway in front of upstreams never loads torch).
    if name == "LocalEngine":
        from adapters.local.engine import LocalEngine

        return LocalEngine
    if name == "EngineStats":
        from adapters.local.core import EngineStats

        return EngineStats
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
