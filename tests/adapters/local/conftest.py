"""Shared fixtures for the embedded engine's tests.

The model is loaded once per session (weights from the conversion cache, shared by every engine
a test builds); the `transformers` reference is loaded only by the parity tests that need it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from adapters.base import EngineRequest
from adapters.local import LocalEngine
from adapters.local.config import LocalEngineConfig, default_model_path
from adapters.local.kernels import CpuKernels, load_kernel
from adapters.local.loader import LoadedModel, load_model
from adapters.schema import ChatCompletionRequest, ChatMessage, CompletionRequest

TEST_THREADS = 1  # one thread: OpenMP barriers on a busy 2-core box cost more than a second thread gains
# Small pools keep tests light; each still holds several 1k-token sequences. Exact products
# (`prefill_activations = "fp32"`, `decode_weights = "fp32"`): the parity and equivalence tests are
# about exact arithmetic; `test_int8_prefill.py` and `test_stock_linear.py` cover the default modes.
TEST_CONFIG = LocalEngineConfig(
    threads=TEST_THREADS,
    kv_budget_tokens=8192,
    max_running=8,
    max_queued=64,
    prefill_activations="fp32",
    decode_weights="fp32",
)


@pytest.fixture(scope="session")
def loaded() -> LoadedModel:
    torch.set_num_threads(TEST_THREADS)
    return load_model(TEST_CONFIG)


def c_kernels_anywhere(cache_dir: Path) -> CpuKernels:
    """The C kernels on any x86-64 host: the native build where this CPU runs it, else the same
    source through SIMDe (`load_kernel(portable=True)`), so their tests run on every host."""
    built = load_kernel(cache_dir) or load_kernel(cache_dir, portable=True)
    if built is None:
        pytest.skip("the C kernels need a C compiler on x86-64 Linux (and simde-py, a dev dependency)")
    return built


def load_model_on_c_kernels(config: LocalEngineConfig, *, portable: bool = False) -> LoadedModel:
    """`config`'s model on the C kernels, as `c_kernels_anywhere` gives them (`portable`: that
    build even where the native one runs, for what this CPU lacks, such as VNNI)."""
    kernels = functools.partial(load_kernel, portable=True) if portable else c_kernels_anywhere
    loaded = load_model(config, kernels=kernels)
    assert loaded.model.attends_in_kernel
    return loaded


@pytest.fixture(scope="session")
def c_kernel_loaded(loaded: LoadedModel) -> LoadedModel:
    """The tests' model on the C kernels: `loaded` itself where they are this host's default."""
    return loaded if loaded.model.attends_in_kernel else load_model_on_c_kernels(TEST_CONFIG)


@pytest.fixture(scope="session")
def make_engine(loaded: LoadedModel) -> Iterator[Callable[..., LocalEngine]]:
    """Build a started engine over the shared weights: `make_engine(radix_cache=False, ...)`."""
    engines: list[LocalEngine] = []

    def build(**overrides: Any) -> LocalEngine:
        engine = LocalEngine(replace(TEST_CONFIG, **overrides), model=loaded)
        engine.start_sync()
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.close_sync()


@pytest.fixture(scope="session")
def engine(make_engine: Callable[..., LocalEngine]) -> LocalEngine:
    """The default-configured engine (radix cache on)."""
    return make_engine()


@pytest.fixture(scope="session")
def hf_model() -> Any:
    """`transformers` loading the same GGUF (fp32): the reference implementation."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(TEST_THREADS)
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    from transformers import AutoTokenizer

    path = default_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def chat(content: str, **fields: Any) -> EngineRequest:
    """A chat request for one user message."""
    params = ChatCompletionRequest(
        model="test", messages=[ChatMessage(role="user", content=content)], **fields
    )
    return wrap(params, "chat")


def completion(prompt: str | list[int] | list[str], **fields: Any) -> EngineRequest:
    """A text completion request."""
    return wrap(CompletionRequest(model="test", prompt=prompt, **fields), "text_completion")


def wrap(params: ChatCompletionRequest | CompletionRequest, operation: Any, salt: str = "") -> EngineRequest:
    return EngineRequest(
        operation=operation, params=params, raw_body=b"", request_id="req", tenant_id="t", cache_salt=salt
    )


async def collect_stream(engine: LocalEngine, request: EngineRequest) -> list[dict[str, Any]]:
    """Every chunk of a streamed answer, decoded."""
    return [json.loads(chunk) async for chunk in engine.stream(request)]


def streamed_text(chunks: list[dict[str, Any]], index: int = 0) -> str:
    """The text of one choice, joined from its chunks."""
    parts = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            if choice["index"] != index:
                continue
            if "delta" in choice:
                parts.append(choice["delta"].get("content") or "")
            else:
                parts.append(choice.get("text") or "")
    return "".join(parts)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalEngineConfig, LoadedModel]:
    """A 2-layer random Llama (262-token byte vocabulary): scheduler tests in milliseconds."""
    from tests.adapters.local.tiny_gguf import write_tiny_gguf

    root = tmp_path_factory.mktemp("tiny")
    write_tiny_gguf(root / "tiny.gguf")
    config = LocalEngineConfig(
        model_path=root / "tiny.gguf",
        model_id="tiny",
        cache_dir=root / "cache",
        threads=TEST_THREADS,
        page_size=16,
        kv_budget_tokens=4096,
        max_running=8,
        max_queued=64,
    )
    return config, load_model(config)


@pytest.fixture(scope="session")
def make_tiny(tiny_model: tuple[LocalEngineConfig, LoadedModel]) -> Iterator[Callable[..., LocalEngine]]:
    """Build a started engine over the tiny model: `make_tiny(kv_budget_tokens=96, ...)`."""
    config, model = tiny_model
    engines: list[LocalEngine] = []

    def build(**overrides: Any) -> LocalEngine:
        engine = LocalEngine(replace(config, **overrides), model=model)
        engine.start_sync()
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.close_sync()
