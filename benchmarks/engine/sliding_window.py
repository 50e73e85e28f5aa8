"""Sliding-window attention with sinks, measured: quality, decode time by history, KV footprint.

Prints one JSON object, all figures from one run on one host:
- perplexity of SmolLM2-135M on the first `--ppl-tokens` tokens of a long deterministic text (the
  `pydantic` wheel's METADATA, its README: ~35k tokens) for dense attention (every token sees the
  whole text; computed from prompt chunks that return every row's logits), sinks + window (S=4,
  W=1,024) and plain truncation to the last W tokens (no sinks), each of those two with every
  token a teacher-forced decode step of its own;
- per-token decode time after a history of 2k-32k tokens with the window (prompt prefilled
  blockwise), against dense attention up to the model's 8k context, side by side;
- peak KV pages the windowed sequence held, against the bound (sinks + window + one page).

    .venv/bin/python -m benchmarks.engine.sliding_window --only quality --threads 2
    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.engine.sliding_window --only speed --threads 2

(`quality` times nothing; `speed` is timed, so it takes the benchmark lock.)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from adapters.local.attention_plan import PageRun, PrefixPlan
from adapters.local.config import LocalEngineConfig
from adapters.local.forward_batch import ForwardBatch, PrefillSegment
from adapters.local.kv_pool import KVPool, kv_dtype
from adapters.local.loader import LoadedModel, load_model
from adapters.local.prefix_cache import PrefixCache
from adapters.local.runner import ModelRunner
from adapters.local.sampling import SamplerState, SamplingParams
from adapters.local.scheduler import Scheduler
from adapters.local.sequence import GenerationJob, Sequence
from adapters.local.text_stream import TextStream
from adapters.local.window import WindowSpec

PAGE = 16
WINDOW = WindowSpec(sinks=4, size=1024, overlap=64)
TRUNCATION = WindowSpec(sinks=0, size=1024, overlap=64)
RECENT_PLUS_QUERY = WindowSpec(sinks=4, size=1025, overlap=64)
"""StreamingLLM's own evaluation (`examples/eval_long_ppl.py`): the cache is trimmed to the sinks and
`recent_size` = 1,024 tokens after each token, and the next is appended, so a token sees 1,024 tokens
before itself: one more than `WINDOW`, whose 1,024 count the token itself."""
DECODE_STEPS = 64
ATTENTION: dict[str, WindowSpec | None] = {
    "dense": None,
    "sinks_4_window_1024": WINDOW,
    "truncation_1024": TRUNCATION,
    "sinks_4_recent_1024_plus_query": RECENT_PLUS_QUERY,
}
"""The perplexities: dense attention (the whole text), sinks + window, plain truncation to W, and the
window as StreamingLLM's evaluation counts it (not run by default)."""


class Stream:
    """One sequence through the engine's scheduler and runner, its next tokens forced."""

    def __init__(
        self, loaded: LoadedModel, kv: torch.dtype, prompt: list[int], window: WindowSpec | None, pages: int
    ) -> None:
        self.pool = KVPool(loaded.spec, pages, PAGE, kv)
        cache = PrefixCache(self.pool, enabled=False, max_cached_tokens=None, policy="lru")
        self.scheduler = Scheduler(
            self.pool, cache, max_running=1, max_prefill_tokens=512, max_idle_prefill_tokens=512
        )
        self.runner = ModelRunner(loaded.model, self.pool)
        params = SamplingParams(max_tokens=1)
        job = GenerationJob(job_id=1, groups=[], params=params, salt="", sink=lambda _: None, window=window)
        sampler = SamplerState(params, loaded.spec.vocab_size, prompt, 0)
        self.seq = Sequence(job, prompt, 0, sampler, TextStream(loaded.tokenizer, ()))
        self.scheduler.add(self.seq)
        self.peak_pages = 0

    def next_logits(self) -> torch.Tensor:
        """Run steps until the sequence samples; its logits."""
        while True:
            out = self.runner.run(self.scheduler.schedule())
            self.peak_pages = max(self.peak_pages, self.pool.usage().used_pages)
            if out.sampled:
                return out.logits[0]


def _pydantic_readme() -> str:
    return importlib.metadata.distribution("pydantic").read_text("METADATA") or ""


def _stdlib_source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).read_text(encoding="utf-8")


TEXTS: dict[str, Callable[[], str]] = {
    "pydantic_readme": _pydantic_readme,
    "python_docs": lambda: _stdlib_source("pydoc_data.topics"),
    "argparse_source": lambda: _stdlib_source("argparse"),
}
"""Long deterministic texts (chosen before any was measured): the pydantic 2.14.4 wheel's README
(its METADATA: prose and code examples), the Python 3.11 standard library's reference-manual topics
(`pydoc_data/topics.py`: prose) and its `argparse.py` (code)."""


def text_tokens(loaded: LoadedModel, count: int, name: str = "pydantic_readme") -> list[int]:
    """The first `count` tokens of the text `name` (`TEXTS`)."""
    tokens = loaded.tokenizer.encode(TEXTS[name]())
    if len(tokens) < count:
        raise SystemExit(f"the text has {len(tokens)} tokens, fewer than {count}")
    return tokens[:count]


DOCUMENT_STARTS = ("none", "bos")
"""What precedes the text: nothing (the text's own first tokens are the sinks; SmolLM2's tokenizer
adds no BOS, `add_bos_token` is false), or the model's BOS token (`tokenizer.ggml.bos_token_id`,
`<|im_start|>` for SmolLM2, which opens every chat the engine serves), the prefix
lm-evaluation-harness's rolling perplexity gives a model with a BOS. The same text tokens are
scored either way; `bos` checks that the window's gap to dense is not its sinks' doing (the README's
ratio did not move: `benchmarks/results/sliding_window.md`)."""


def document_start(loaded: LoadedModel, name: str) -> list[int]:
    """The ids that precede the text (`DOCUMENT_STARTS`)."""
    bos = loaded.tokenizer.special.bos_id
    if name == "none" or bos is None:
        return []
    return [bos]


def dense_perplexity(
    loaded: LoadedModel, kv: torch.dtype, tokens: list[int], scored_from: int = 1, chunk: int = 512
) -> float:
    """Dense attention's perplexity of `tokens[scored_from:]`, from prompt chunks that return every
    row's logits: causal attention over the whole text, the same per-token logits as teacher-forced
    decode steps (up to rounding; exact fp32 products, as decode rows have), at a fraction of the time."""
    pool = KVPool(loaded.spec, -(-len(tokens) // PAGE), PAGE, kv)
    nll = 0.0
    with torch.inference_mode():
        for start in range(0, len(tokens) - 1, chunk):
            rows = min(chunk, len(tokens) - 1 - start)
            prefix = PrefixPlan(runs=[PageRun(0, start)]) if start else None  # pages 0.. hold it in order
            batch = ForwardBatch(
                token_ids=torch.tensor(tokens[start : start + rows]),
                positions=torch.arange(start, start + rows),
                slots=torch.arange(start, start + rows),  # page p holds tokens p*16.. (slot = index)
                logit_rows=torch.arange(rows),
                prefills=[PrefillSegment(start=0, length=rows, prefix=prefix, int8=False)],
            )
            logits = loaded.model.forward(batch, pool).double()
            targets = torch.tensor(tokens[start + 1 : start + rows + 1])
            losses = torch.logsumexp(logits, 1) - logits[torch.arange(rows), targets]
            nll += float(losses[max(0, scored_from - 1 - start) :].sum())
    return math.exp(nll / (len(tokens) - scored_from))


def perplexity(
    loaded: LoadedModel, kv: torch.dtype, tokens: list[int], window: WindowSpec | None, scored_from: int = 1
) -> float:
    """Perplexity of `tokens[scored_from:]`, each token a decode step of its own, teacher-forced."""
    if window is None:
        return dense_perplexity(loaded, kv, tokens, scored_from)
    stream = Stream(loaded, kv, tokens[:1], window, pages=len(tokens) // PAGE + 2)
    nll = 0.0
    for index, token in enumerate(tokens[1:], 1):
        logits = stream.next_logits().double()
        if index >= scored_from:
            nll += float(torch.logsumexp(logits, 0) - logits[token])
        stream.seq.tokens.append(token)
    return math.exp(nll / (len(tokens) - scored_from))


def decode_ms(
    loaded: LoadedModel, kv: torch.dtype, history: list[int], window: WindowSpec | None
) -> tuple[float, int]:
    """Mean ms per decode step after `history` (prefilled), and the peak pages held."""
    stream = Stream(loaded, kv, history, window, pages=(len(history) + DECODE_STEPS) // PAGE + 4)
    stream.next_logits()  # the prompt, blockwise
    for _ in range(4):  # warm-up steps
        stream.seq.tokens.append(history[len(stream.seq.tokens) % len(history)])
        stream.next_logits()
    started = time.perf_counter()
    for _ in range(DECODE_STEPS):
        stream.seq.tokens.append(history[len(stream.seq.tokens) % len(history)])
        stream.next_logits()
    return (time.perf_counter() - started) * 1e3 / DECODE_STEPS, stream.peak_pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ppl-tokens", type=int, default=8192)
    parser.add_argument("--no-c-kernels", action="store_true", help="c_kernels = false (torch's path)")
    parser.add_argument(
        "--exact",
        action="store_true",
        help="torch's exact fp32 mode (fp32 weights for every row, a float32 pool): the C kernels' "
        "figures where they do not build",
    )
    parser.add_argument("--only", choices=("quality", "speed"), help="one half of the benchmark")
    parser.add_argument(
        "--text", choices=tuple(TEXTS), default="pydantic_readme", help="the perplexity's text"
    )
    parser.add_argument(
        "--document-start",
        choices=DOCUMENT_STARTS,
        default="none",
        help="what precedes the text (DOCUMENT_STARTS); the same text tokens are scored either way",
    )
    parser.add_argument(
        "--attention",
        nargs="+",
        choices=tuple(ATTENTION),
        default=("dense", "sinks_4_window_1024", "truncation_1024"),
        help="which perplexities (each its own process in parallel, if you like)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = LocalEngineConfig(threads=args.threads, c_kernels=not args.no_c_kernels)
    if args.exact:
        config = replace(config, decode_weights="fp32", kv_dtype="float32", prefill_activations="fp32")
    loaded = load_model(config)
    kv = kv_dtype(config.kv_dtype, loaded.model.dtype, loaded.model.serves_packed)  # the engine's pool
    figures: dict[str, object] = {
        "host": platform.processor() or platform.machine(),
        "threads": args.threads,
        "c_kernels": loaded.model.attends_in_kernel,
        "exact": args.exact or loaded.model.attends_in_kernel,
        "kv_dtype": str(kv).removeprefix("torch."),
    }
    if args.only != "speed":
        text = text_tokens(loaded, max(16384, args.ppl_tokens), args.text)
        figures["text"] = args.text
        figures["document_start"] = args.document_start
        start = document_start(loaded, args.document_start)
        figures["perplexity"] = quality(
            loaded, kv, start + text[: args.ppl_tokens], args.attention, len(start) + 1
        )
    if args.only != "quality":
        figures.update(speed(loaded, kv, text_tokens(loaded, 32768)))
    print(json.dumps(figures, indent=2))


def quality(
    loaded: LoadedModel, kv: torch.dtype, ppl: list[int], names: list[str], scored_from: int
) -> dict[str, float]:
    """Perplexity on `ppl[scored_from:]` of each of `names` (`ATTENTION`)."""
    quality: dict[str, float] = {"tokens": len(ppl), "scored": len(ppl) - scored_from}
    for name in names:
        quality[name] = round(perplexity(loaded, kv, ppl, ATTENTION[name], scored_from), 3)
        print(f"perplexity {name}: {quality[name]}", file=sys.stderr, flush=True)  # progress
    return quality


def speed(loaded: LoadedModel, kv: torch.dtype, text: list[int]) -> dict[str, object]:
    """Decode ms per token by history, windowed and dense side by side; the window's peak KV."""
    figures: dict[str, object] = {}
    window_ms: dict[str, float] = {}
    dense_ms: dict[str, float] = {}
    peak = 0
    for history in (2048, 4096, 8000, 16384, 32768):
        ms, pages = decode_ms(loaded, kv, text[:history], WINDOW)
        window_ms[str(history)] = round(ms, 2)
        peak = max(peak, pages)
        if history + DECODE_STEPS + 8 <= loaded.spec.context_length:
            dense_ms[str(history)] = round(decode_ms(loaded, kv, text[:history], None)[0], 2)
    figures["decode_ms_per_token"] = {"window": window_ms, "dense": dense_ms}
    figures["window_peak_kv_pages"] = peak
    figures["window_kv_bound_pages"] = WINDOW.max_pages(PAGE)
    figures["window_peak_kv_bytes"] = peak * KVPool(loaded.spec, 1, PAGE, kv).page_nbytes
    return figures


if __name__ == "__main__":
    main()
