"""Deterministic prompts for the engine benchmark, and the two engines' timing harnesses.

Prompts are seeded random token ids from the ordinary vocabulary range, identical for our
engine, `transformers` and llama.cpp. Every generation bans EOS (ours: logit bias; transformers:
`min_new_tokens`), so both produce exactly the number of tokens asked for.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adapters.local import LocalEngine
from adapters.local.sampling import SamplingParams

EOS = 2
VOCAB_LOW, VOCAB_HIGH = 100, 40_000


def token_ids(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(count)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, logit_bias=((EOS, -100.0),))


@dataclass(slots=True)
class Timed:
    seconds: float
    """Submission to the last token."""
    first_token_s: float
    """Submission to the first token."""
    token_times: list[float]
    """Arrival time of each generated token, relative to submission."""


async def _generate_timed(engine: LocalEngine, prompt: list[int], params: SamplingParams) -> Timed:
    """Our engine, timing each token as the engine thread hands it over."""
    start = time.perf_counter()
    times: list[float] = []
    async for deltas in engine.generate_stream(prompt, params):
        times.extend(time.perf_counter() - start for _ in deltas)
    return Timed(seconds=times[-1], first_token_s=times[0], token_times=times)


def ours(engine: LocalEngine, prompts: Sequence[list[int]], max_tokens: int) -> tuple[float, list[Timed]]:
    """Submit all prompts at once; return (wall seconds, per-prompt timings)."""

    async def go() -> tuple[float, list[Timed]]:
        start = time.perf_counter()
        results = await asyncio.gather(*(_generate_timed(engine, p, greedy(max_tokens)) for p in prompts))
        return time.perf_counter() - start, list(results)

    return asyncio.run(go())


class _Clock:
    """A `transformers` streamer that records when each new token appears."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter() - self.start)

    def end(self) -> None:
        pass


def reference(model: Any, prompt: list[int], max_tokens: int) -> Timed:
    """`transformers` greedy generate on one prompt, timing each token."""
    clock = _Clock()
    with torch.inference_mode():
        model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            streamer=clock,
        )
    return Timed(seconds=clock.times[-1], first_token_s=clock.times[0], token_times=clock.times)


def reference_forward_s(model: Any, prompt: list[int]) -> float:
    """`transformers` forward over the whole prompt (logits at every position, as a plain
    `model(ids)` call computes them): seconds to the first token."""
    with torch.inference_mode():
        start = time.perf_counter()
        int(model(torch.tensor([prompt]), use_cache=True).logits[0, -1].argmax())
        return time.perf_counter() - start


def reference_suffix_ttft(model: Any, prefix: list[int], suffix: list[int]) -> float:
    """`transformers` with the prefix's KV already computed: seconds to the first token of the suffix."""
    import copy

    with torch.inference_mode():
        cached = model(torch.tensor([prefix]), use_cache=True).cache
        reused = copy.deepcopy(cached)
        start = time.perf_counter()
        logits = model(torch.tensor([suffix]), cache=reused, use_cache=True, logits_to_keep=1).logits
        int(logits[0, -1].argmax())
        return time.perf_counter() - start


def decode_phase_tok_s(timed: list[Timed]) -> float:
    """Tokens per second of the streams after the last of them got its first token."""
    begin = max(t.first_token_s for t in timed)
    end = max(t.seconds for t in timed)
    tokens = sum(1 for t in timed for at in t.token_times if at > begin)
    return tokens / (end - begin)


def per_token_ms(timed: Timed) -> float:
    """Mean gap between consecutive generated tokens (decode only), in ms."""
    gaps = timed.token_times[-1] - timed.token_times[0]
    return gaps / (len(timed.token_times) - 1) * 1000


def load_llama_cpp(path: Path, threads: int, context: int, *, repack: bool = False) -> Any | None:
    """llama.cpp (`llama-cpp-python`, the optional `bench` extra) on the same GGUF with the same
    threads; None where it is not installed. `repack`: let it move weights into its extra buffer
    types (AMX / repacked layouts); off by default because on the dev box's KVM guest (AMX flags
    shown) the first decode with them crashed (SIGSEGV in `llama_decode`), so the baseline runs
    ggml-cpu's ordinary AVX-512 kernels on the Q4_1 blocks as stored."""
    try:
        import llama_cpp
    except ImportError:
        return None
    defaults = llama_cpp.llama_model_default_params

    def model_params() -> Any:
        params = defaults()
        params.use_extra_bufts = repack
        return params

    # `Llama` takes no argument for it: it reads the library's defaults while it loads the model.
    llama_cpp.llama_cpp.llama_model_default_params = model_params
    try:
        return llama_cpp.Llama(
            model_path=str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False
        )
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = defaults


def llama_cpp_cpu() -> str:
    """The instruction sets the loaded llama.cpp library was built for (ggml-cpu's system info:
    a native build lists the host's, AVX-512 included; a build with `GGML_NATIVE=OFF` and
    `GGML_AVX512=OFF` lists AVX2)."""
    import llama_cpp

    info: bytes = llama_cpp.llama_print_system_info()
    return info.decode().strip()


def llama_cpp(model: Any, prompt: list[int], max_tokens: int) -> Timed:
    """llama.cpp greedy decoding of `prompt` from an empty cache, timing each token (its generator
    never stops at EOS by itself, so it gives exactly `max_tokens`)."""
    model.reset()  # no prefix of an earlier prompt is reused
    start = time.perf_counter()
    times: list[float] = []
    for _ in model.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        times.append(time.perf_counter() - start)
        if len(times) == max_tokens:
            break
    return Timed(seconds=times[-1], first_token_s=times[0], token_times=times)
