"""The baselines, `transformers` and llama.cpp, each in a process of its own, called over a pipe.

torch's OpenMP runtime (libgomp) keeps one thread team per thread that ran parallel work, and
while the process's teams hold more threads than the host has cores, their threads stop spinning
between parallel regions and sleep instead, so every region pays a wake-up. `transformers` on the
benchmark's main thread beside the engine thread (2 teams of 2 on 2 cores) slowed the engine's
small-op steps 1.4-1.7x and its cached-prefix TTFT 1.2-1.4x (2026-12-02, 2 cores). `make serve`
has one team (the engine thread's); in its own process each engine has one. llama.cpp's OpenMP
threads share that runtime: `llama-cpp-python` loads `libgomp.so.1`, which torch has loaded already.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch

from adapters.local.config import default_model_path
from benchmarks.engine.workloads import (
    Timed,
    llama_cpp,
    llama_cpp_cpu,
    load_llama_cpp,
    reference,
    reference_forward_s,
    reference_suffix_ttft,
)

_model: Any = None  # the child's model, loaded once by `_load` or `_load_llama`


class ReferenceProcess:
    """The `workloads.reference*` harnesses run on a model loaded in a child process."""

    def __init__(self, threads: int) -> None:
        context = multiprocessing.get_context("spawn")  # no copy of the parent's thread state
        self._pool = ProcessPoolExecutor(1, mp_context=context, initializer=_load, initargs=(threads,))
        self._pool.submit(int).result()  # loaded before anything is timed

    def generate(self, prompt: list[int], max_tokens: int) -> Timed:
        """`workloads.reference`: greedy generate, each token timed."""
        return self._pool.submit(_generate, prompt, max_tokens).result()

    def forward_s(self, prompt: list[int]) -> float:
        """`workloads.reference_forward_s`."""
        return self._pool.submit(_forward_s, prompt).result()

    def suffix_ttft(self, prefix: list[int], suffix: list[int]) -> float:
        """`workloads.reference_suffix_ttft`."""
        return self._pool.submit(_suffix_ttft, prefix, suffix).result()

    def close(self) -> None:
        self._pool.shutdown()


class LlamaProcess:
    """`workloads.llama_cpp` on llama.cpp loaded in a child process (`LLAMA_CPP_LIB_PATH` holds)."""

    def __init__(self, threads: int, context: int) -> None:
        spawn = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(
            1, mp_context=spawn, initializer=_load_llama, initargs=(threads, context)
        )
        self.cpu = self._pool.submit(_llama_cpu).result()
        """The instruction sets the child's llama.cpp was built for (`workloads.llama_cpp_cpu`)."""

    @staticmethod
    def installed() -> bool:
        """Whether `llama-cpp-python` (the `bench` extra) is installed."""
        return importlib.util.find_spec("llama_cpp") is not None

    def generate(self, prompt: list[int], max_tokens: int) -> Timed:
        """`workloads.llama_cpp`: greedy decoding from an empty cache, each token timed."""
        return self._pool.submit(_llama_generate, prompt, max_tokens).result()

    def close(self) -> None:
        self._pool.shutdown()


def _load_llama(threads: int, context: int) -> None:
    global _model
    _model = load_llama_cpp(default_model_path(), threads, context)


def _llama_cpu() -> str:
    return llama_cpp_cpu()


def _llama_generate(prompt: list[int], max_tokens: int) -> Timed:
    return llama_cpp(_model, prompt, max_tokens)


def _load(threads: int) -> None:
    global _model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    _model = model.eval()


def _generate(prompt: list[int], max_tokens: int) -> Timed:
    return reference(_model, prompt, max_tokens)


def _forward_s(prompt: list[int]) -> float:
    return reference_forward_s(_model, prompt)


def _suffix_ttft(prefix: list[int], suffix: list[int]) -> float:
    return reference_suffix_ttft(_model, prefix, suffix)
