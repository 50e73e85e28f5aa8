"""The embedded engine's parts, assembled from its config and loaded weights: the KV pool, the
offload tiers, the prefix cache, the scheduler, the drafter and the engine thread (`assemble`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from adapters.local.chat_template import ChatTemplate
from adapters.local.config import LocalEngineConfig
from adapters.local.core import EngineCore
from adapters.local.drafts import Drafter
from adapters.local.grammar import GrammarCompiler
from adapters.local.kv_pool import KVPool, dtype_name, kv_dtype
from adapters.local.loader import LoadedModel
from adapters.local.offload import KVOffload
from adapters.local.prefix_cache import PrefixCache
from adapters.local.prepare import EngineLimits
from adapters.local.runner import ModelRunner
from adapters.local.scheduler import Scheduler
from adapters.local.tokenizer import TextTokenizer
from adapters.local.window import WindowSpec


@dataclass(slots=True)
class LoadedEngine:
    """A started engine's parts, as `LocalEngine` uses them."""

    core: EngineCore
    tokenizer: TextTokenizer
    template: ChatTemplate
    limits: EngineLimits
    grammars: GrammarCompiler
    window: WindowSpec | None
    """The window windowed requests attend with; None where it does not fit this model (`window_error`)."""
    window_error: str = ""
    offload: KVOffload | None = None

    def stop(self, flush_s: float) -> None:
        """Stop the engine thread, then write the cached pages not yet on disk and finish the
        offload's disk writes, both within `flush_s` seconds, and release its directory."""
        self.core.stop()
        if self.offload is None:
            return
        deadline = time.monotonic() + flush_s
        self.core.scheduler.windows.persist()  # kept windows awaiting their next turn, to L3
        self.offload.finish_by(deadline)
        if self.offload.write_behind is not None:
            self.offload.write_behind.flush(deadline)
        self.offload.close(deadline)


def assemble(cfg: LocalEngineConfig, loaded: LoadedModel) -> LoadedEngine:
    """Build the engine's parts over `loaded` and start its thread."""
    spec, model, tokenizer = loaded.spec, loaded.model, loaded.tokenizer
    configured = WindowSpec(sinks=cfg.window_sink_tokens, size=cfg.window_size, overlap=cfg.window_overlap)
    window: WindowSpec | None = configured
    window_error = ""
    try:
        configured.check(cfg.page_size, spec.context_length)
    except ValueError as exc:
        if cfg.sliding_window:
            raise
        window, window_error = None, str(exc)  # only requests that ask for one are refused
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    num_pages = cfg.kv_budget_tokens // cfg.page_size
    pool = KVPool(spec, num_pages, cfg.page_size, kv_dtype(cfg.kv_dtype, model.dtype, model.serves_packed))
    offload = (
        KVOffload(
            pool,
            model_id=f"{cfg.model_id}/{dtype_name(pool.k.dtype)}",  # KV of another dtype is another cache
            tokenizer_hash=loaded.sha256,  # the GGUF holds the tokenizer and template too
            memory_bytes=cfg.kv_offload_memory_bytes,
            directory=cfg.kv_offload_dir.expanduser() if cfg.kv_offload_dir is not None else None,
            disk_bytes=cfg.kv_offload_disk_bytes,
            min_speedup=cfg.kv_offload_min_speedup,
            write_behind_after_s=cfg.kv_write_behind_after_s,
        )
        if cfg.kv_offload and cfg.radix_cache
        else None
    )
    cache = PrefixCache(
        pool,
        enabled=cfg.radix_cache,
        max_cached_tokens=cfg.max_cached_tokens,
        policy=cfg.eviction_policy,
        offload=offload,
    )
    scheduler = Scheduler(
        pool,
        cache,
        max_running=cfg.max_running,
        max_prefill_tokens=cfg.max_prefill_tokens,
        max_idle_prefill_tokens=cfg.max_idle_prefill_tokens,
    )
    max_context = min(cfg.max_context or spec.context_length, spec.context_length)
    drafter = (
        Drafter(cache, max_draft_tokens=cfg.max_draft_tokens, sources=cfg.draft_sources)
        if cfg.draft_sources
        else None
    )
    core = EngineCore(
        ModelRunner(model, pool),
        cache,
        scheduler,
        tokenizer,
        max_queued=cfg.max_queued,
        max_context=max_context,
        threads=cfg.threads,
        drafter=drafter,
    )
    core.start()
    limits = EngineLimits(
        vocab_size=spec.vocab_size,
        max_context=max_context,
        pool_tokens=num_pages * cfg.page_size,
        page_size=cfg.page_size,
        max_n=cfg.max_running,
        max_beam_width=min(cfg.beam_width, cfg.max_running),
        window_pages=window.max_pages(cfg.page_size) if window is not None else 0,
        window_size=window.size if window is not None else 0,
    )
    return LoadedEngine(
        core=core,
        tokenizer=tokenizer,
        template=loaded.template,
        limits=limits,
        grammars=GrammarCompiler(tokenizer, spec.vocab_size),
        window=window,
        window_error=window_error,
        offload=offload,
    )
