"""The engine thread: take requests, step the batch, sample, hand results back.

One daemon thread owns the model, the KV pool, the prefix cache and the scheduler, so none of
them needs a lock. The event loop talks to it through a small inbox (submit, cancel) guarded by
a lock and an Event that wakes the thread; results go out through each job's `sink`, which the
async side implements with `loop.call_soon_threadsafe`. New requests join between steps, and a
cancelled job's sequences are dropped (pages released) before the next step runs. Each iteration
also writes a bounded few due cache pages behind to disk (`adapters.local.write_behind`).

A failure inside a step fails every job in flight with an `EngineError` and resets the pool, so
one bad batch cannot wedge the engine.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from adapters.engine_stats import INTER_TOKEN_BUCKETS, LatencyFigures, LatencyHistogram
from adapters.errors import EngineError, EngineOverloaded
from adapters.local.beam_group import BeamGroup
from adapters.local.beams import BeamState
from adapters.local.drafts import Drafter, SpeculationFigures
from adapters.local.emit import TokenEmitter, can_speculate
from adapters.local.grammar import mask_rows
from adapters.local.loader import release_heap
from adapters.local.prefix_cache import PrefixCache
from adapters.local.runner import ModelRunner, StepOutput
from adapters.local.sampling import SamplerState, bias_greedy_rows
from adapters.local.scheduler import ScheduledStep, Scheduler
from adapters.local.sequence import GenerationJob, JobEvent, JobFailed, Sequence, Status
from adapters.local.text_stream import TextStream
from adapters.local.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)

_STATS_INTERVAL_S = 0.1


@dataclass(slots=True, frozen=True)
class EngineStats:
    """A snapshot of the engine's memory and cache, refreshed by the engine thread."""

    page_size: int
    pool_pages_total: int
    pool_pages_free: int
    active_pages: int
    """Pages held by running sequences (the rest of the used pages only back the prefix cache)."""
    cached_tokens: int
    """Tokens whose KV the prefix cache keeps."""
    cache_hit_tokens: int
    """Prompt tokens served from the prefix cache since start."""
    cache_query_tokens: int
    """Prompt tokens looked up in the prefix cache since start."""
    running: int
    waiting: int
    preemptions: int
    """Sequences pushed back to the queue to free pages, since start."""
    weight_bytes: int
    kv_pool_bytes: int
    """The pool's reserved size; resident memory grows only with the pages used."""
    evicted_tokens: int
    """Cached tokens evicted to make room or to respect `max_cached_tokens`, since start."""
    queue_time: LatencyFigures
    """Seconds from submission to first admission, per request, since start."""
    inter_token_latency: LatencyFigures
    """Seconds between two consecutive tokens of one sequence, since start."""
    cache_nodes: int
    """Nodes of the prefix cache's radix tree (distinct cached prefix segments)."""
    kv_bytes_per_token: int
    """K and V bytes of one token, every layer."""
    speculation: SpeculationFigures | None = None
    """Speculative decoding's counters since start; None when no draft source runs."""
    beam_searches: int = 0
    """Beam searches finished since start."""
    beam_early_stops: int = 0
    """Of those, searches that stopped before `max_tokens` (early stopping)."""
    window_hits: int = 0
    """Windowed prompts whose kept cache started from cached pages, since start."""
    window_misses: int = 0
    """Windowed prompts that computed their kept cache from scratch, since start."""
    window_slid_pages: int = 0
    """Pages that slid out of windows and went back to the pool (or the cache), since start."""
    window_pages: int = 0
    """Pages running windowed sequences hold now."""
    window_capacity_pages: int = 0
    """The most pages those sequences may hold (sinks, full windows, one page each being filled)."""
    window_kept_pages: int = 0
    """Pages of finished windowed sequences' kept caches, held for reuse by their next turn."""
    window_offloaded: int = 0
    """Kept windows saved to the offload's L2/L3 tiers (leaving memory, or at shutdown), since start."""
    window_loaded: int = 0
    """Kept windows loaded back from those tiers by a later turn (window hits too), since start."""

    @property
    def pool_pages_used(self) -> int:
        return self.pool_pages_total - self.pool_pages_free


class EngineCore:
    """Continuous-batching loop over one model. Public methods are safe from any thread."""

    def __init__(
        self,
        runner: ModelRunner,
        cache: PrefixCache,
        scheduler: Scheduler,
        tokenizer: TextTokenizer,
        *,
        max_queued: int,
        max_context: int,
        threads: int | None,
        drafter: Drafter | None = None,
    ) -> None:
        """`drafter`: speculative decoding's draft source for the jobs that ask for it; None: off."""
        self.runner = runner
        self.drafter = drafter
        self.emitter = TokenEmitter(
            scheduler, tokenizer.eos_id, max_context, drafter, runner.model.decode_row_limit
        )
        self.cache = cache
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.max_queued = max_queued
        self.max_context = max_context
        self._threads = threads
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._inbox: deque[GenerationJob] = deque()
        self._cancelled: set[int] = set()
        self._flushes: list[concurrent.futures.Future[None]] = []
        self._jobs: dict[int, list[Sequence]] = {}
        self._queued = 0
        self._stopping = False
        self._inter_token = LatencyHistogram(INTER_TOKEN_BUCKETS)
        self._beam_searches = self._beam_early_stops = 0
        self._stats = self._snapshot()
        self._stats_at = 0.0
        self._thread = threading.Thread(target=self._loop, name="radixgate-local-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread after its current step; jobs in flight are failed."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def stats(self) -> EngineStats:
        return self._stats

    def submit(self, job: GenerationJob) -> None:
        """Queue a job; raises EngineOverloaded when `max_queued` requests already wait."""
        with self._lock:
            if self._stopping:
                raise EngineError("the local engine is shutting down")
            if self._queued >= self.max_queued:
                raise EngineOverloaded(
                    f"the local engine is at capacity: {self._queued} requests already wait for a slot; "
                    "retry shortly"
                )
            self._queued += 1
            self._inbox.append(job)
        self._wake.set()

    def flush_cache(self) -> concurrent.futures.Future[None]:
        """Drop every unlocked cached prefix before the next step; the future completes when done."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._flushes.append(done)
        self._wake.set()
        return done

    def cancel(self, job_id: int) -> None:
        """Drop a job (client gone); its pages are released before the next step."""
        with self._lock:
            self._cancelled.add(job_id)
        self._wake.set()

    # ---- engine thread -----------------------------------------------------------------

    def _loop(self) -> None:
        if self._threads is not None:
            torch.set_num_threads(self._threads)
        while True:
            self._wake.clear()
            if not self._take_inbox():
                break
            write_in = self._write_due()
            if not self.scheduler.has_work():
                self._publish_stats(force=True)
                self._wake.wait(write_in)  # woken by work, or when the next page is due for disk
                continue
            step = self.scheduler.schedule()
            self.emitter.draft(step)
            self._queued_update()
            if not step.decodes and not step.prefills:
                self._publish_stats(force=True)
                self._wake.wait(0.05)  # nothing fits until something finishes or is cancelled
                continue
            try:
                started = time.perf_counter()
                output = self.runner.run(step)
                self.scheduler.observe_step(step, time.perf_counter() - started)
                self._postprocess(step, output)
                if step.prefills:
                    release_heap()  # a prefill's activations would otherwise stay resident
            except Exception as exc:
                logger.exception("local engine step failed")
                self._fail_all(EngineError(f"the local engine failed: {exc}"))
            self._publish_stats()
        self._fail_all(EngineError("the local engine stopped"))

    def _write_due(self) -> float | None:
        """The prefix cache's write-behind share of this iteration (a few page copies at most)."""
        try:
            return self.cache.write_due(busy=self.scheduler.has_work())
        except Exception:  # a failed disk copy loses a cache entry, never the engine
            logger.exception("KV write-behind failed")
            return None

    def _take_inbox(self) -> bool:
        with self._lock:
            jobs, self._inbox = list(self._inbox), deque()
            cancelled, self._cancelled = self._cancelled, set()
            flushes, self._flushes = self._flushes, []
            stopping = self._stopping
        for job in jobs:
            self._enqueue(job)
        for job_id in cancelled:
            for seq in self._jobs.pop(job_id, []):
                if seq.status is not Status.FINISHED:
                    self.scheduler.finish(seq, keep_kv=False)
        if flushes:
            self.cache.clear()
            self.scheduler.windows.kept.clear()
            self._publish_stats(force=True)
            for done in flushes:
                done.set_result(None)
        self._queued_update()
        return not stopping

    def _enqueue(self, job: GenerationJob) -> None:
        seqs: list[Sequence] = []
        for group in job.groups:
            leader: Sequence | None = None
            for offset in range(group.n):
                index = group.first_index + offset
                sampler = SamplerState(job.params, self.runner.model.spec.vocab_size, group.prompt, index)
                seq = Sequence(job, group.prompt, index, sampler, TextStream(self.tokenizer, job.params.stop))
                # Drafts go with neither a grammar (its mask covers one row) nor a window (its slide moves the
                # rows' positions).
                speculates = job.speculate and job.grammar is None and job.window is None
                speculates = speculates and can_speculate(job.params)
                if self.drafter is not None and speculates:
                    seq.spec = self.drafter.state()
                seqs.append(seq)
                if leader is None:
                    leader = seq
                    seq.reports_cache = True
                    self.scheduler.add(seq, group.carry)
                    if job.params.beam_search:
                        seq.beam = BeamGroup(seq, BeamState.of(job.params, group.n))
                else:
                    leader.forks.append(seq)
                    seq.beam = leader.beam
        self._jobs[job.job_id] = seqs

    def _queued_update(self) -> None:
        waiting_jobs = {s.job.job_id for s in self.scheduler.waiting}
        with self._lock:
            self._queued = len(self._inbox) + len(waiting_jobs)

    def _postprocess(self, step: ScheduledStep, output: StepOutput) -> None:
        for seq, _ in step.prefills:
            self.scheduler.cache_progress(seq)
        events: dict[int, list[JobEvent]] = {}
        started = finished = False
        row_params = [seq.params for seq in output.sampled for _ in range(1 + len(seq.draft))]
        # A constrained sequence never drafts (`_enqueue`), so its one row is its grammar's next token.
        mask_rows(output.logits, [seq.grammar for seq in output.sampled for _ in range(1 + len(seq.draft))])
        bias_greedy_rows(output.logits, row_params)
        argmax = output.logits.argmax(dim=-1).tolist()
        now = time.monotonic()
        rows = {seq.seq_id: first for seq, first in zip(output.sampled, output.first_rows, strict=True)}
        searched: set[int] = set()
        for seq, first in zip(output.sampled, output.first_rows, strict=True):
            beams = seq.beam
            if beams is not None:  # the whole group's rows at once, the first time one of its beams comes up
                if id(beams) not in searched:
                    searched.add(id(beams))
                    choices = beams.advance(
                        rows, output.logits, self.scheduler, self.tokenizer, self.max_context
                    )
                    if choices:
                        self._beam_searches += 1
                        self._beam_early_stops += beams.state.stopped_early
                        events.setdefault(seq.job.job_id, []).extend(choices)
                        finished = True
                continue
            group = [seq]
            if seq.forks and seq.output_len == 0:
                group += self.scheduler.fork(seq)
            for member in group:
                if member.output_len:
                    self._inter_token.observe(now - member.last_token_at)
                member.last_token_at = now
                deltas = self.emitter.advance(member, output.logits, argmax, first)
                for _ in deltas[1:]:  # accepted draft tokens arrive with the step's first one
                    self._inter_token.observe(0.0)
                events.setdefault(member.job.job_id, []).extend(deltas)
                started = started or member.output_len == len(deltas)
                finished = finished or deltas[-1].finish_reason is not None
        # Publish first, so a client that sees its first token also sees the pages it holds, and one
        # that sees its last token the pages it freed (between those, stats are up to 0.1 s old).
        self._publish_stats(force=started or finished)
        for job_id, items in events.items():
            seqs = self._jobs.get(job_id)
            if seqs is None:
                continue
            seqs[0].job.sink(items)
            if all(s.status is Status.FINISHED for s in seqs):
                del self._jobs[job_id]

    def _fail_all(self, error: EngineError) -> None:
        for seqs in list(self._jobs.values()):
            for seq in seqs:
                if seq.status is not Status.FINISHED:
                    self.scheduler.finish(seq, keep_kv=False)
            seqs[0].job.sink([JobFailed(error)])
        self._jobs.clear()
        with self._lock:
            jobs, self._inbox = list(self._inbox), deque()
        for job in jobs:
            job.sink([JobFailed(error)])
        self._queued_update()

    def _publish_stats(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._stats_at >= _STATS_INTERVAL_S:
            self._stats = self._snapshot()
            self._stats_at = now

    def _snapshot(self) -> EngineStats:
        pool = self.runner.pool
        windows = self.scheduler.windows
        window_pages, window_capacity = windows.footprint(self.scheduler.running)
        return EngineStats(
            page_size=pool.page_size,
            pool_pages_total=pool.num_pages,
            pool_pages_free=pool.free_pages,
            active_pages=pool.num_pages
            - pool.free_pages
            - self.cache.cached_only_pages()
            - windows.kept.pages,
            cached_tokens=self.cache.cached_pages * pool.page_size,
            cache_hit_tokens=self.cache.hit_tokens,
            cache_query_tokens=self.cache.queried_tokens,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            preemptions=self.scheduler.preemptions,
            weight_bytes=self.runner.model.weight_bytes,
            kv_pool_bytes=pool.nbytes,
            evicted_tokens=self.cache.evicted_pages * pool.page_size,
            queue_time=self.scheduler.queue_time.figures(),
            inter_token_latency=self._inter_token.figures(),
            cache_nodes=self.cache.node_count,
            kv_bytes_per_token=pool.page_nbytes // pool.page_size,
            speculation=self.drafter.figures() if self.drafter is not None else None,
            beam_searches=self._beam_searches,
            beam_early_stops=self._beam_early_stops,
            window_hits=windows.hits,
            window_misses=windows.misses,
            window_slid_pages=windows.slid_pages,
            window_kept_pages=windows.kept.pages,
            window_offloaded=windows.store.saved if windows.store is not None else 0,
            window_loaded=windows.store.loaded if windows.store is not None else 0,
            window_pages=window_pages,
            window_capacity_pages=window_capacity,
        )
