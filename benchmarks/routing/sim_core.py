"""The cost model of one simulated GPU engine: a prefix cache, a queue and continuous batching.

It models what makes routing matter on a real SGLang/vLLM replica:

- one KV pool of `capacity_tokens`, shared by the prefix cache (a `cachelayer` radix tree, LRU,
  leaf-first) and the running requests (their prompt pages are locked, their decode tokens reserved);
- prefill costs `prefill_s_per_token` per *uncached* prompt token and blocks decoding while it runs,
  as a prefill batch does on a GPU;
- decode advances every running request (at most `max_running`) by one token per step, and a step
  costs `decode_step_s + decode_s_per_request * batch`;
- requests that do not fit wait in a FIFO queue.

Costs are in simulated seconds; `time_scale` shrinks them to wall-clock time so a benchmark of minutes
stands for a much longer run. The engine counts the prompt and cached tokens it really saw, so hit
rates come from the workers, not from the router.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.routing.sim_kv import SimKvEvents
from cachelayer.radix import RadixNode, RadixTree

DEFAULT_CAPACITY_TOKENS = 32_768
DEFAULT_MAX_RUNNING = 32
DEFAULT_PREFILL_S_PER_TOKEN = 50e-6
"""~20k prefill tokens/s: an 8B model on one H100-class GPU."""
DEFAULT_PREFILL_OVERHEAD_S = 5e-3
DEFAULT_DECODE_STEP_S = 15e-3
DEFAULT_DECODE_S_PER_REQUEST = 0.25e-3
DEFAULT_MAX_PREFILL_TOKENS = 16_384
"""Uncached tokens one prefill batch may take (SGLang's `--max-prefill-tokens`)."""
DEFAULT_TIME_SCALE = 1.0
DEFAULT_STREAM_INTERVAL = 32
"""Decode steps between streamed chunks (SGLang's `--stream-interval`)."""


@dataclass(slots=True)
class SimConfig:
    """How big and how fast the simulated engine is."""

    capacity_tokens: int = DEFAULT_CAPACITY_TOKENS
    """KV pool size in tokens (SGLang's `max_total_num_tokens`)."""
    max_running: int = DEFAULT_MAX_RUNNING
    """Largest decode batch."""
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS
    prefill_s_per_token: float = DEFAULT_PREFILL_S_PER_TOKEN
    prefill_overhead_s: float = DEFAULT_PREFILL_OVERHEAD_S
    """Fixed cost of one prefill batch."""
    decode_step_s: float = DEFAULT_DECODE_STEP_S
    decode_s_per_request: float = DEFAULT_DECODE_S_PER_REQUEST
    time_scale: float = DEFAULT_TIME_SCALE
    """Wall seconds per simulated second."""
    stream_interval: int = DEFAULT_STREAM_INTERVAL


class PromptTooLong(ValueError):
    """The request can never fit in the KV pool."""


@dataclass(slots=True, eq=False)
class SimRequest:
    """One request inside the engine."""

    prompt: list[int]
    max_new_tokens: int
    output_vocab: Sequence[int]
    seed: bytes = b""
    salt: str = ""
    """The tenant's cache salt (its KV events carry it; the simulated cache itself is shared)."""
    reserved: int = 0
    cached_tokens: int = 0
    output: list[int] = field(default_factory=list)
    finished: bool = False
    node: RadixNode[None] | None = None
    updates: asyncio.Queue[bool] = field(default_factory=asyncio.Queue)
    """Gets True after each emitted batch of tokens, and once more when the request finishes."""

    def next_token(self) -> int:
        """Deterministic output: the same prompt always generates the same tokens."""
        digest = hashlib.blake2b(len(self.output).to_bytes(4, "little") + self.seed, digest_size=8).digest()
        return self.output_vocab[int.from_bytes(digest, "little") % len(self.output_vocab)]


def _fingerprint(tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(str(list(tokens[-64:])).encode() + len(tokens).to_bytes(4, "little")).digest()


@dataclass(slots=True)
class SimStats:
    """Counters the engine exports on `/metrics`."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    busy_s: float = 0.0


class SimEngine:
    """Continuous-batching scheduler over a radix prefix cache, in simulated time."""

    def __init__(self, config: SimConfig, kv_events: SimKvEvents | None = None) -> None:
        self.config = config
        self.kv_events = kv_events
        self.cache: RadixTree[None] = RadixTree(on_evict=kv_events.evicted if kv_events is not None else None)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = SimStats()
        self._reserved = 0  # decode tokens promised to running requests
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run the scheduler loop on the current event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop the scheduler loop."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def submit(
        self, prompt: list[int], max_new_tokens: int, output_vocab: Sequence[int], salt: str = ""
    ) -> SimRequest:
        """Queue a request; raises `PromptTooLong` when it could never be scheduled."""
        if not prompt:
            raise PromptTooLong("the prompt is empty")
        if len(prompt) + max_new_tokens > self.config.capacity_tokens:
            raise PromptTooLong(
                f"prompt of {len(prompt)} tokens plus {max_new_tokens} new tokens exceeds the "
                f"KV pool of {self.config.capacity_tokens} tokens"
            )
        request = SimRequest(
            prompt=prompt,
            max_new_tokens=max(1, max_new_tokens),
            output_vocab=output_vocab,
            seed=_fingerprint(prompt),
            salt=salt,
        )
        self.waiting.append(request)
        self._wake.set()
        return request

    def abort(self, request: SimRequest) -> None:
        """Stop a request whose client went away: dequeue it, or end it at its next step."""
        if request.finished:
            return
        if request in self.waiting:
            self.waiting.remove(request)
            request.finished = True
            return
        request.max_new_tokens = max(1, len(request.output))

    def flush(self) -> bool:
        """Drop the prefix cache; refused (False) while requests run or wait, as SGLang does."""
        if self.running or self.waiting:
            return False
        self.cache.clear()
        if self.kv_events is not None:
            self.kv_events.cleared()
        return True

    @property
    def token_usage(self) -> float:
        """Fraction of the KV pool in use (cache plus reservations)."""
        return min(1.0, (self.cache.total_tokens + self._reserved) / self.config.capacity_tokens)

    # ---- scheduler --------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
            admitted = self._admit()
            if admitted:
                cost = self.config.prefill_overhead_s + self.config.prefill_s_per_token * sum(
                    len(r.prompt) - r.cached_tokens for r in admitted
                )
                deadline = await self._spend(deadline, cost)
                for request in admitted:
                    self._emit_token(request)
                    request.updates.put_nowait(True)
                self._retire()
                continue
            if not self.running:
                # Waiting requests that cannot fit yet: nothing runs that could free memory.
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = await self._decode_span(deadline)

    async def _spend(self, deadline: float, sim_seconds: float) -> float:
        """Sleep until `deadline + cost`; deadlines chain so wake-up jitter does not accumulate."""
        loop = asyncio.get_running_loop()
        self.stats.busy_s += sim_seconds
        deadline = max(deadline, loop.time() - 0.05) + sim_seconds * self.config.time_scale
        delay = deadline - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        return deadline

    async def _decode_span(self, deadline: float) -> float:
        """Run decode steps until a chunk is due, a request finishes, or a new request arrives."""
        loop = asyncio.get_running_loop()
        interval = self.config.stream_interval
        steps_due = min(
            min(r.max_new_tokens - len(r.output), interval - len(r.output) % interval) for r in self.running
        )
        step_s = self.config.decode_step_s + self.config.decode_s_per_request * len(self.running)
        wall_step = step_s * self.config.time_scale
        start = max(deadline, loop.time() - 0.05)
        steps = steps_due
        if self.waiting:
            steps = 1
        else:
            self._wake.clear()
            try:
                await asyncio.wait_for(
                    self._wake.wait(), timeout=max(0.0, start + steps * wall_step - loop.time())
                )
                elapsed = loop.time() - start
                steps = min(steps_due, max(1, math.ceil(elapsed / wall_step)))
            except TimeoutError:
                pass
        # The span's wall time has (mostly) been waited for above: the steps end at `start + steps *
        # wall_step`, not that long after now (`_spend` from here would sleep the span twice, and a
        # request arriving mid-span would wait the elapsed span again before its prefill).
        self.stats.busy_s += step_s * steps
        deadline = start + steps * wall_step
        delay = deadline - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        for request in self.running:
            for _ in range(steps):
                self._emit_token(request)
            # Only requests at a chunk boundary stream now (finished ones hear from `_retire`).
            if len(request.output) % interval == 0 and len(request.output) < request.max_new_tokens:
                request.updates.put_nowait(True)
        self._retire()
        return deadline

    def _admit(self) -> list[SimRequest]:
        admitted: list[SimRequest] = []
        budget = self.config.max_prefill_tokens
        while self.waiting and len(self.running) < self.config.max_running and budget > 0:
            request = self.waiting[0]
            match = self.cache.match_prefix(request.prompt)
            # The last prompt token is always recomputed to produce the first output token.
            cached = min(match.length, len(request.prompt) - 1)
            need = len(request.prompt) - cached + request.max_new_tokens
            free = self.config.capacity_tokens - self.cache.total_tokens - self._reserved
            if free < need:
                self.cache.lock(match.node)
                self.cache.evict(need - free)
                self.cache.unlock(match.node)
                free = self.config.capacity_tokens - self.cache.total_tokens - self._reserved
                if free < need:
                    break
            if admitted and len(request.prompt) - cached > budget:
                break
            budget -= len(request.prompt) - cached
            self.waiting.popleft()
            request.cached_tokens = cached
            self.cache.insert(request.prompt)
            if self.kv_events is not None:
                self.kv_events.cached(request.prompt, request.salt)
            request.node = self.cache.match_prefix(request.prompt).node
            self.cache.lock(request.node)
            request.reserved = request.max_new_tokens
            self._reserved += request.reserved
            self.running.append(request)
            admitted.append(request)
            self.stats.requests += 1
            self.stats.prompt_tokens += len(request.prompt)
            self.stats.cached_tokens += cached
        return admitted

    def _emit_token(self, request: SimRequest) -> None:
        if len(request.output) < request.max_new_tokens:
            request.output.append(request.next_token())
            self.stats.generation_tokens += 1

    def _retire(self) -> None:
        """Finish requests that produced all their tokens; their output stays cached, like SGLang's."""
        still: list[SimRequest] = []
        for request in self.running:
            if len(request.output) < request.max_new_tokens:
                still.append(request)
                continue
            assert request.node is not None
            self.cache.unlock(request.node)
            self._reserved -= request.reserved
            self.cache.insert(request.prompt + request.output)
            if self.kv_events is not None:
                self.kv_events.cached(request.prompt + request.output, request.salt)
            request.finished = True
            request.updates.put_nowait(True)
        self.running = still
        overflow = self.cache.total_tokens + self._reserved - self.config.capacity_tokens
        if overflow > 0:
            self.cache.evict(overflow)
        if self.waiting:
            self._wake.set()
