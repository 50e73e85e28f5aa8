"""How long one cache_aware routing decision takes for a 32k-token prompt, and what the trees weigh.

The pool is the real `WorkerPool` over 4 workers whose engines are never called; each worker's tree
is first filled the way a busy cluster fills it (64 shared 2k-token prefixes with their suffixes).
A decision is one `acquire` + `release` with the prompt already tokenized (tokenizing is the
tokenizer's cost, not the router's), timed in wall time and in this thread's CPU time (on a shared
2-core machine, wall-time tails include preemption by other processes). Tree trims, which the pool
runs right after a decision, are timed separately. Tree memory is measured with tracemalloc.

`byte_chat_cpu_*`: the whole routing of a chat request on the default path when no tokenizer is
configured or found, prompt to worker: templating, UTF-8 bytes as token ids, the trees. Each request
a new 2,176-word message (no sharing: nothing comes from the segment cache), 4 workers with 32k-token
caches, CPU time of the decision's thread.

    .venv/bin/python -m benchmarks.routing.decision
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import tracemalloc
from array import array
from collections.abc import AsyncIterator, Sequence

import msgspec

from adapters.base import Completion, EngineRequest
from adapters.schema import ChatCompletionRequest, ChatMessage, CompletionRequest, Operation
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.routing.pool import WorkerPool

PROMPT_TOKENS = 32_768
DECISIONS = 2_000
VOCAB = 50_000
CHAT_WORDS = 2_176
CHAT_DECISIONS = 1_000
_WORDS = ("cache", "prefix", "worker", "token", "route", "engine", "gateway", "request", "model", "würde")


class _IdleEngine:
    provider_name = "bench"
    server_address = "127.0.0.1"
    server_port: int | None = None

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec

    async def complete(self, request: EngineRequest) -> Completion:
        return Completion(body=b"{}")

    async def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        yield b"{}"

    async def check_health(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def _request(tokens: Sequence[int]) -> EngineRequest:
    params = CompletionRequest(model="m", prompt="", max_tokens=256)
    request = _engine_request(params, "tenant")
    request.prompt_token_ids = tokens  # type: ignore[assignment]  # the pool also takes uint32 arrays
    return request


def _chat_request(content: str) -> EngineRequest:
    """A chat of one user message, with no tokens: the pool tokenizes it (bytes, here)."""
    params = ChatCompletionRequest(
        model="m", messages=[ChatMessage(role="user", content=content)], max_tokens=256
    )
    return _engine_request(params, "")


def _engine_request(params: CompletionRequest | ChatCompletionRequest, salt: str) -> EngineRequest:
    operation: Operation = "chat" if isinstance(params, ChatCompletionRequest) else "text_completion"
    raw = msgspec.json.encode(params)
    return EngineRequest(
        operation=operation, params=params, raw_body=raw, request_id="r", tenant_id="t", cache_salt=salt
    )


def _pool(capacity_tokens: int) -> WorkerPool:
    """The real pool over 4 idle workers of `capacity_tokens` each, shipped routing defaults."""
    specs = [
        WorkerSpec(
            url=f"http://127.0.0.1:{9000 + i}", id=f"w{i}", models=["m"], capacity_tokens=capacity_tokens
        )
        for i in range(4)
    ]
    return WorkerPool(["m"], specs, RoutingSettings(), engine_factory=_IdleEngine)


async def _measure() -> dict[str, float]:
    rng = random.Random(3)
    tracemalloc.start()
    pool = _pool(4_000_000)
    prefixes = [[rng.randrange(VOCAB) for _ in range(2048)] for _ in range(64)]
    for prefix in prefixes:  # warm trees: each prefix with 16 distinct 128-token suffixes
        for _ in range(16):
            lease = await pool.acquire(_request(prefix + [rng.randrange(VOCAB) for _ in range(128)]))
            lease.release(usage=None, failed=False)
    tree_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    tree_tokens = sum(w.tree.total_tokens for w in pool.workers())
    long_prefix = [rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS - 1024)]
    timings: list[float] = []
    trims: list[float] = []
    cpu: list[float] = []
    for i in range(DECISIONS):
        # Half the prompts share a 31k-token prefix (the expensive, long-match case), half are new.
        head = long_prefix if i % 2 else [rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS - 1024)]
        tokens = array("I", head + [rng.randrange(VOCAB) for _ in range(1024)])
        request = _request(tokens)
        started, cpu_started = time.perf_counter(), time.thread_time()
        lease = await pool.acquire(request)
        lease.release(usage=None, failed=False)
        timings.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - cpu_started)
        trim_started = time.perf_counter()
        await asyncio.sleep(0)  # let a scheduled tree trim run, and time it separately
        trims.append(time.perf_counter() - trim_started)
    timings.sort()
    cpu.sort()
    await pool.aclose()
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "decisions": DECISIONS,
        "p50_ms": round(statistics.median(timings) * 1e3, 3),
        "p99_ms": round(timings[int(0.99 * len(timings))] * 1e3, 3),
        "max_ms": round(timings[-1] * 1e3, 3),
        "cpu_p50_ms": round(statistics.median(cpu) * 1e3, 3),
        "cpu_p99_ms": round(cpu[int(0.99 * len(cpu))] * 1e3, 3),
        "trim_max_ms": round(max(trims) * 1e3, 3),
        "trims_over_1ms": sum(1 for t in trims if t > 1e-3),
        "warm_tree_tokens": tree_tokens,
        "warm_tree_bytes_tracemalloc": tree_bytes,
        "bytes_per_tree_token": round(tree_bytes / tree_tokens, 2),
    }


async def _measure_byte_chat() -> dict[str, float]:
    rng = random.Random(5)
    pool = _pool(32_768)
    cpu: list[float] = []
    for i in range(CHAT_DECISIONS + 100):  # the first 100 fill the trees and are not timed
        request = _chat_request(" ".join(rng.choice(_WORDS) for _ in range(CHAT_WORDS)))
        cpu_started = time.thread_time()
        lease = await pool.acquire(request)
        lease.release(usage=None, failed=False)
        if i >= 100:
            cpu.append(time.thread_time() - cpu_started)
        await asyncio.sleep(0)  # the scheduled tree trims run (untimed, as above)
    await pool.aclose()
    cpu.sort()
    return {
        "byte_chat_words": CHAT_WORDS,
        "byte_chat_cpu_p50_ms": round(statistics.median(cpu) * 1e3, 3),
        "byte_chat_cpu_p90_ms": round(cpu[int(0.9 * len(cpu))] * 1e3, 3),
    }


def measure_decisions() -> dict[str, float]:
    """Decision latency percentiles and tree memory (see the module docstring)."""
    return {**asyncio.run(_measure()), **asyncio.run(_measure_byte_chat())}


if __name__ == "__main__":
    print(measure_decisions())
