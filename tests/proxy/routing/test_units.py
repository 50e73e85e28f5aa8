"""One unit everywhere: with no tokenizer configured, a tree still holds a whole cache's worth of
prefixes, and the tokenizer is found from the engine where the engine says where it is."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec

from adapters.schema import PromptTokensDetails, Usage
from benchmarks.routing.workload import write_word_tokenizer
from proxy.routing.admin import worker_status
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.routing.pool import WorkerPool
from tests.proxy.routing.conftest import FakeEngine, chat_request

CAPACITY = 32_768
PROMPT_WORDS = 2_048


def _words(rng: random.Random, count: int) -> str:
    return " ".join(f"w{rng.randrange(50_000)}x" for _ in range(count))


class WordCountingEngine(FakeEngine):
    """Reports a 32k-token KV pool; its tokens are words (the router is not told)."""

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(spec)
        self.capacity = CAPACITY


class PathEngine(WordCountingEngine):
    """Says where its tokenizer lies, as SGLang's `/server_info` does."""

    path = ""

    async def tokenizer_path(self) -> str | None:
        return self.path


class TokenizingEngine(WordCountingEngine):
    """Has `/tokenize` but says nothing of its tokenizer's path."""

    async def tokenize(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]


def _pool(engine: type[FakeEngine], count: int = 2) -> WorkerPool:
    specs = [
        WorkerSpec(kind="sglang", url=f"http://127.0.0.1:{9100 + i}", id=f"w{i}", models=["m"])
        for i in range(count)
    ]
    return WorkerPool(["m"], specs, msgspec.convert({}, RoutingSettings), engine_factory=engine)


def _usage(prompt: str, cached: int = 0) -> Usage:
    # The engine's count: words plus a few template tokens (the router's bytes know neither).
    return Usage(
        prompt_tokens=len(prompt.split()) + 8, prompt_tokens_details=PromptTokensDetails(cached_tokens=cached)
    )


async def test_default_flags_no_tokenizer_the_tree_keeps_a_whole_caches_worth_of_prefixes() -> None:
    pool = _pool(WordCountingEngine)
    await pool.health.check_all()  # the engines report their 32k-token capacity
    rng = random.Random(3)
    # 24 system prompts of 2,048 engine tokens (~13 KB each): 12 per worker fill 75% of its cache.
    systems = [_words(rng, PROMPT_WORDS) for _ in range(24)]
    for system in systems:
        lease = await pool.acquire(chat_request(system, "q", max_tokens=16))
        lease.release(usage=_usage(system), failed=False)
    for worker in pool.workers():
        assert worker.capacity_tokens == CAPACITY and worker.capacity_source == "engine"
        # Learned from the engines' prompt_tokens: about 6.9 bytes per word-token, not 1 or 4.
        assert 6.0 < worker.units_per_token < 8.0
        status = worker_status(pool, worker)
        assert status.tokenizers == {"m": "bytes"} and status.tokenizer_sources == {"m": "utf-8"}
    # Every prefix is still predicted in full on some worker: no tree evicted what its engine holds.
    for system in systems:
        tokens, _ = await pool.prompts.tokens(chat_request(system, "q"), pool.workers())
        best = max(worker.match(tokens) for worker in pool.workers())
        assert best / len(tokens) > 0.95
    # The decisions' figures are in the engine's tokens (~2,050), not in bytes (~14,000).
    lease = await pool.acquire(chat_request(systems[0], "another question", max_tokens=16))
    assert 1_900 < lease._predicted < 2_200
    lease.release(usage=_usage(systems[0], cached=PROMPT_WORDS), failed=False)


async def test_a_tokenizer_the_engine_names_is_loaded_and_used(tmp_path: Path) -> None:
    PathEngine.path = str(write_word_tokenizer(tmp_path / "tokenizer.json"))
    pool = _pool(PathEngine)
    await pool.start()
    try:
        status = worker_status(pool, pool.workers()[0])
        assert status.tokenizers == {"m": "tokenizer.json"}
        assert status.tokenizer_sources == {"m": PathEngine.path}
        lease = await pool.acquire(chat_request("alpha beta", "gamma"))
        assert lease._routed is not None and lease._routed.kind == "tokenizer.json"
        assert status.units_per_token == 1.0
    finally:
        await pool.aclose()


async def test_an_unreadable_path_falls_back_to_the_engines_tokenize() -> None:
    class Both(TokenizingEngine, PathEngine):
        pass

    PathEngine.path = "/nonexistent/model/dir"
    pool = _pool(Both)
    await pool.start()
    try:
        status = worker_status(pool, pool.workers()[0])
        assert status.tokenizers == {"m": "engine"}
        assert status.tokenizer_sources["m"] in ("w0/tokenize", "w1/tokenize")
        tokens, kind = await pool.prompts.tokens(chat_request("one two three", "four"), pool.workers())
        assert kind == "engine" and len(tokens) < 20  # word-sized ids from the engine, not bytes
    finally:
        await pool.aclose()


async def test_an_engine_without_tokenizer_or_tokenize_leaves_bytes() -> None:
    pool = _pool(WordCountingEngine)
    await pool.start()
    try:
        assert worker_status(pool, pool.workers()[0]).tokenizers == {"m": "bytes"}
    finally:
        await pool.aclose()
