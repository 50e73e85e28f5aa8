"""Continuous batching: which sequences run in the next step, and how many tokens each computes.

Every step (nano-vllm's schedule -> run -> postprocess):
1. Running sequences with one token to compute (decoding) all run; each may need a fresh page
   for its next slot. If the pool is out of pages even after evicting cached prefixes, the most
   recently admitted sequence is preempted: its KV goes into the prefix cache (so coming back
   costs little), its pages are released, and it returns to the front of the queue.
2. Sequences still prefilling get chunks from a per-step budget of `max_prefill_tokens`, so a
   long prompt is spread over steps and running decodes keep their pace (chunked prefill). When
   nothing decodes there is no one to stall, and the budget is `max_idle_prefill_tokens`.
3. While budget, `max_running` and pages allow, waiting requests are admitted in arrival order:
   the prefix cache supplies what it can, pages are allocated for the rest of the prompt (plus
   one page per extra choice, for the copy of a shared partial page), and the first chunk joins
   this step. A request that shares a longer prefix with a sequence still prefilling than the
   cache holds waits for it (in-batch prefix sharing): next step that prefix is cached.

A windowed sequence (`window`) slides before its work is scheduled (`window_paging`): pages that
fall out of its window go back to the pool, and the rotations its kept keys need ride on the
step for the runner. Its pages are allocated chunk by chunk, never for the whole prompt, and a
prompt that continues an earlier windowed conversation takes over that one's kept cache.

The scheduler deals in page ids and token counts; tensors belong to the runner.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

from adapters.engine_stats import QUEUE_TIME_BUCKETS, LatencyHistogram
from adapters.errors import EngineError
from adapters.local.kv_pool import KVPool
from adapters.local.prefix_cache import PrefixCache
from adapters.local.sequence import Sequence, Status
from adapters.local.window import Carry, KeyMove, WindowState
from adapters.local.window_paging import WindowPaging

_WAIT_FOR_TOKENS = 64
"""Prompt tokens a request must stand to gain before it waits a step for another's prefill."""
_COMPARE_SLICE = 256


@dataclass(slots=True)
class ScheduledStep:
    """One step's work: decoding sequences, then prefill chunks as (sequence, tokens)."""

    decodes: list[Sequence] = field(default_factory=list)
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)
    rotations: list[KeyMove] = field(default_factory=list)
    """Keys to move before the step runs, in order (windows that slid)."""


class Scheduler:
    """Waiting queue, running set and page accounting. Engine thread only."""

    def __init__(
        self,
        pool: KVPool,
        cache: PrefixCache,
        *,
        max_running: int,
        max_prefill_tokens: int,
        max_idle_prefill_tokens: int,
    ) -> None:
        self.pool = pool
        self.cache = cache
        self.page_size = pool.page_size
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.max_idle_prefill_tokens = max(max_idle_prefill_tokens, max_prefill_tokens)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._reserved: dict[int, list[int]] = {}  # seq_id -> pages set aside for its forks' copies
        self._order = itertools.count()
        self.preemptions = 0
        self.windows = WindowPaging(pool, cache, self._alloc)
        """Windowed sequences' slides, rotations and reuse, with their figures."""
        self.queue_time = LatencyHistogram(QUEUE_TIME_BUCKETS)
        """Seconds from submission to first admission, per request."""

    def add(self, seq: Sequence, carry: Carry | None = None) -> None:
        """Queue a group leader (its sibling choices ride in `seq.forks`); `carry`: what of a
        windowed prompt its window never cuts."""
        if seq.job.window is not None:
            seq.window = WindowState(seq.job.window, self.page_size, carry)
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        """Pick this step's work (possibly empty when the pool cannot admit anyone)."""
        step = ScheduledStep()
        self.windows.begin_step()
        for seq in list(self.running):
            # Skips sequences preempted earlier in this loop.
            if seq.status is Status.RUNNING and not seq.in_prefill and self._ensure_slot(seq):
                step.decodes.append(seq)
        budget = self.max_prefill_tokens if step.decodes else self.max_idle_prefill_tokens
        for seq in list(self.running):
            if seq.status is Status.RUNNING and seq.in_prefill and budget > 0:
                chunk = self._chunk(seq, min(budget, seq.remaining))
                budget -= chunk
                if chunk:
                    step.prefills.append((seq, chunk))
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if len(self.running) + 1 + len(seq.forks) > self.max_running or not self._admit(seq):
                break
            self.waiting.popleft()
            chunk = self._chunk(seq, min(budget, seq.remaining))
            budget -= chunk
            if chunk:
                step.prefills.append((seq, chunk))
        step.rotations = self.windows.rotations()
        return step

    def fork(self, leader: Sequence) -> list[Sequence]:
        """Start the leader's sibling choices on its prompt KV: full pages shared, the partial one copied."""
        children, leader.forks = leader.forks, []
        reserved = self._reserved.pop(leader.seq_id, [])
        held = self._held_pages(leader, leader.num_computed)
        full = held - (leader.num_computed % self.page_size != 0)
        for child in children:
            shared = leader.pages[:full]
            self.pool.retain(shared)
            child.pages = list(shared)
            child.window = leader.window.copy() if leader.window is not None else None
            if child.window is not None:
                self.pool.retain(child.window.anchors)
            if full < held:
                copy = reserved.pop()
                self.pool.copy_page(leader.pages[full], copy)
                child.pages.append(copy)
            child.num_computed = leader.num_computed
            child.lock = leader.lock
            if child.lock is not None:
                self.cache.lock(child.lock)
            self._start(child)
        self.pool.release(reserved)
        return children

    def rebase(self, seq: Sequence, onto: Sequence) -> None:
        """Give `seq` the KV of `onto` (a beam taking over a dropped one's sequence, running again
        if it had finished): whole pages shared, copy-on-write, the partial last page copied.
        Tokens are the caller's."""
        full = onto.num_computed // self.page_size
        shared = onto.pages[:full]
        self.pool.retain(shared)
        copy = self._alloc(1) if onto.num_computed % self.page_size else []
        if copy is None:
            self.pool.release(shared)
            raise EngineError("the KV pool has no page left for a beam's copy")
        if copy:
            self.pool.copy_page(onto.pages[full], copy[0])
        self._release(seq)
        seq.pages = shared + copy
        seq.num_computed = onto.num_computed
        seq.lock = onto.lock
        if seq.lock is not None:
            self.cache.lock(seq.lock)
        if seq.status is Status.FINISHED:
            self._start(seq)

    def finish(self, seq: Sequence, *, keep_kv: bool) -> None:
        """Take `seq` out; with `keep_kv` its computed tokens go into the prefix cache first."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if keep_kv:
            self._cache_progress(seq)
            self.windows.keep(seq)
        self._release(seq)
        seq.status = Status.FINISHED
        self.cache.enforce_cap()

    def reserve_draft(self, seq: Sequence, tokens: int) -> int:
        """Slots for up to `tokens` draft tokens after `seq`'s next one, from free pages only (a
        draft never evicts or preempts); returns how many fit."""
        ps = self.page_size
        want = -(-(seq.num_computed + tokens + 1) // ps) - len(seq.pages)
        if want > 0:
            pages = self.pool.alloc(min(want, self.pool.free_pages))
            seq.pages.extend(pages or [])
        return min(tokens, len(seq.pages) * ps - seq.num_computed - 1)

    def trim_pages(self, seq: Sequence) -> None:
        """Release the pages past `seq`'s next slot: what a rejected draft's tokens were written to."""
        keep = seq.num_computed // self.page_size + 1
        if len(seq.pages) > keep:
            self.pool.release(seq.pages[keep:])
            del seq.pages[keep:]

    def observe_step(self, step: ScheduledStep, seconds: float) -> None:
        """The runner computed `step` in `seconds`: the prefill speed the KV offload weighs loads by."""
        self.cache.observe_prefill(sum(chunk for _, chunk in step.prefills), seconds)

    def cache_progress(self, seq: Sequence) -> None:
        """Publish `seq`'s computed whole pages to the prefix cache and lock them for it."""
        self._cache_progress(seq)

    # ---- internals -----------------------------------------------------------------------

    def _admit(self, seq: Sequence) -> bool:
        window = seq.window
        # A windowed sequence reuses at most what it would compute before its first slide.
        lookup = (
            len(seq.tokens) - 1
            if window is None
            else min(len(seq.tokens) - 1, window.sinks + window.spec.size)
        )
        hit = self.cache.match(seq.salt, seq.tokens[:lookup])
        if self._worth_waiting(seq, hit.tokens):
            self.cache.unlock(hit.node)
            self.pool.release(hit.pages)
            return False
        if window is not None and self.windows.resume(seq, hit.tokens):
            self.cache.unlock(hit.node)
            self.pool.release(hit.pages)
            return self._admit_resumed(seq)
        # A windowed sequence takes pages for its first chunk only (`_chunk` adds the rest).
        upto = (
            len(seq.tokens) if window is None else min(len(seq.tokens), hit.tokens + window.room(hit.tokens))
        )
        need = max(0, -(-upto // self.page_size) - len(hit.pages))
        partial = seq.prompt_len % self.page_size != 0 and seq.output_len == 0
        extra = len(seq.forks) if partial else 0
        fresh = self._alloc(need + extra)
        if fresh is None:
            self.cache.unlock(hit.node)
            self.pool.release(hit.pages)
            return False
        seq.pages = hit.pages + fresh[:need]
        if extra:
            self._reserved[seq.seq_id] = fresh[need:]
        seq.num_computed = hit.tokens
        seq.lock = hit.node
        if seq.output_len == 0:
            seq.cached_tokens = hit.tokens
            self.cache.record(seq.prompt_len, hit.tokens)
            if window is not None:
                self.windows.admitted(seq, hit.tokens)
        self._start(seq)
        return True

    def _worth_waiting(self, seq: Sequence, cached: int) -> bool:
        """True when a sequence now prefilling shares at least `_WAIT_FOR_TOKENS` more of `seq`'s
        prompt than the cache holds: admitted next step, `seq` will find that prefix cached."""
        return any(
            other.in_prefill
            and other.salt == seq.salt
            and _common_prefix(seq.tokens, other.tokens) - cached >= _WAIT_FOR_TOKENS
            for other in self.running
        )

    def _start(self, seq: Sequence) -> None:
        if seq.queued_at is not None:
            self.queue_time.observe(time.monotonic() - seq.queued_at)
            seq.queued_at = None
        seq.status = Status.RUNNING
        seq.admitted_at = next(self._order)
        self.running.append(seq)

    def _ensure_slot(self, seq: Sequence) -> bool:
        """Make sure `seq` has a page for its next token (its window slid first, when it has one);
        False if `seq` itself had to be preempted."""
        while not (seq.window is None or self.windows.slide(seq, seq.num_computed)):
            if self._preempt_latest(seq):
                return False
        while len(seq.pages) < self._held_pages(seq, seq.num_computed + 1):
            pages = self._alloc(1)
            if pages is not None:
                seq.pages.extend(pages)
                continue
            if self._preempt_latest(seq):
                return False
        return True

    def _preempt_latest(self, seq: Sequence) -> bool:
        """Preempt the most recently admitted sequence to free pages; True when that was `seq`."""
        victim = max(self.running, key=lambda s: s.admitted_at)
        self._preempt(victim)
        return victim is seq

    def _held_pages(self, seq: Sequence, tokens: int) -> int:
        """Entries of `seq`'s page table that hold its first `tokens` tokens."""
        if seq.window is not None:
            return seq.window.held_pages(tokens)
        return -(-tokens // self.page_size)

    def _chunk(self, seq: Sequence, chunk: int) -> int:
        """Prompt tokens `seq` computes this step, at most `chunk` (a windowed one's may be fewer)."""
        return chunk if seq.window is None else self.windows.chunk(seq, chunk)

    def _admit_resumed(self, seq: Sequence) -> bool:
        """`seq` took over a kept window (`WindowPaging.resume`): it starts after that history."""
        if seq.output_len == 0:
            seq.cached_tokens = seq.num_computed
            self.cache.record(seq.prompt_len, seq.num_computed)
            self.windows.admitted(seq, seq.num_computed)
        self._start(seq)
        return True

    def _alloc(self, count: int) -> list[int] | None:
        pages = self.pool.alloc(count)
        if pages is None:
            self.cache.evict(count - self.pool.free_pages)
            pages = self.pool.alloc(count)
        if pages is None:  # kept windows waiting for reuse go last
            self.windows.kept.evict(count - self.pool.free_pages)
            pages = self.pool.alloc(count)
        return pages

    def _preempt(self, seq: Sequence) -> None:
        self.preemptions += 1
        self.running.remove(seq)
        self._cache_progress(seq)
        if seq.window is not None:  # its kept cache waits for it (or it recomputes from the start)
            self.windows.keep(seq)
        self._release(seq)
        seq.num_computed = 0
        if seq.window is not None:
            seq.window.reset()
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def _cache_progress(self, seq: Sequence) -> None:
        if not self.cache.enabled or seq.num_computed < self.page_size:
            return
        if seq.window is not None and seq.window.slid:
            return  # its pages no longer hold the prefix in order
        node = self.cache.insert(seq.salt, seq.tokens[: seq.num_computed], seq.pages)
        self.cache.lock(node)
        if seq.lock is not None:
            self.cache.unlock(seq.lock)
        seq.lock = node

    def _release(self, seq: Sequence) -> None:
        if seq.lock is not None:
            self.cache.unlock(seq.lock)
            seq.lock = None
        self.pool.release(seq.pages)
        seq.pages = []
        if seq.window is not None:
            self.pool.release(seq.window.anchors)
            seq.window.anchors = []
        self.pool.release(self._reserved.pop(seq.seq_id, []))


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists (compared in slices, at C speed)."""
    limit = min(len(a), len(b))
    done = 0
    while done < limit:
        step = min(_COMPARE_SLICE, limit - done)
        if a[done : done + step] != b[done : done + step]:
            while a[done] == b[done]:
                done += 1
            return done
        done += step
    return done
