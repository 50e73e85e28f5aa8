"""One worker's state as the router sees it: its engine, its load, its health and its prefix tree.

The tree is an *approximation* of the engine's prefix cache: the router inserts each prompt it sends
there, sizes the tree to the engine's KV capacity (LRU, leaf first, plus a TTL) and shrinks that size
when the engine reports fewer cached tokens than the tree predicted, because then the engine is
evicting sooner than the tree does.

Capacity, costs and predictions are in the engine's tokens. The tree's keys are token ids when the
router has the model's tokenizer, else UTF-8 bytes: then `units_per_token` (bytes per engine token,
learned per model from the engine's reported `prompt_tokens`) converts, so a tree of bytes still
holds a whole cache's worth of prefixes.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from adapters.base import Engine
from adapters.spec_metrics import UpstreamSpeculation
from cachelayer.radix import RadixTree
from proxy.routing.breaker import CircuitBreaker
from proxy.routing.config import DEFAULT_EVICT_HEADROOM, BreakerSettings, WorkerSpec
from proxy.routing.kv_events import KvEventFeed
from proxy.routing.kv_index import chain_keys

Health = Literal["unknown", "up", "down"]

MIN_CAPACITY_FRACTION = 0.75
"""The capacity estimate never shrinks below this fraction of the capacity: forgetting a prefix loses
its affinity, which costs more than a wrong prediction (that one miss re-caches it on the same worker)."""
SHRINK_FACTOR = 0.95
GROW_FACTOR = 1.01
MISPREDICTION_TOLERANCE = 0.05
"""An over-prediction smaller than this fraction of the prompt is noise (page rounding, templates)..."""
DEFAULT_BYTES_PER_TOKEN = 4.0
"""UTF-8 bytes per token assumed until the engine's first reported `prompt_tokens` (English text
under a BPE vocabulary; the learned figure replaces it after one request)."""
BYTES_PER_TOKEN_SMOOTHING = 0.1
"""Weight of each new sample in the learned bytes per token (an exponential moving average)."""

MISPREDICTION_MIN_TOKENS = 16
"""... and so is one below a KV page (engines cache whole pages and always recompute the last token)."""


@dataclass(slots=True)
class InFlight:
    """What the router charged a worker for one request it has not heard back about."""

    prefill: float
    """Uncached prompt tokens: pending prefill until `expires`, then done (no longer queued work)."""
    decode: float
    """Weighted expected output tokens: queued work until the request ends."""
    expires: float
    pending: bool = True


@dataclass(slots=True, eq=False)
class Worker:
    """A worker in the pool."""

    id: str
    spec: WorkerSpec
    engine: Engine
    breaker: CircuitBreaker
    capacity_tokens: int
    """The KV capacity the tree is sized to (from config, the engine, or the default)."""
    capacity_source: str
    tree: RadixTree[None] = field(default_factory=RadixTree)
    health: Health = "unknown"
    last_healthy: float = float("-inf")
    """When (time.monotonic) a health check last passed; panic mode tries the most recent one."""
    draining: bool = False
    in_flight: int = 0
    queued_work: float = 0.0
    prefill_free_at: float = 0.0
    """When (on the pool's clock) the prefill of the requests dispatched so far should be done: each
    adds its uncached tokens at the configured prefill speed, behind the ones before it."""
    capacity_estimate: float = 0.0
    """The capacity (tokens) after corrections from engine-reported cached tokens."""
    units_per_token: float = 1.0
    """Tree keys per engine token: 1 for token ids, the learned bytes per token for a byte tree."""
    bytes_per_token: dict[str, float] = field(default_factory=dict)
    """Per model routed on UTF-8 bytes: prompt bytes per engine prompt token, learned."""
    requests: int = 0
    failures: int = 0
    predicted_tokens: int = 0
    reported_cached_tokens: int = 0
    predictions: int = 0
    """Requests whose engine reported `cached_tokens`, each compared with the tree's prediction."""
    prediction_error_tokens: int = 0
    """Sum over those requests of |predicted - reported| cached tokens."""
    mispredictions: int = 0
    discovered_models: list[str] = field(default_factory=list)
    """Models the engine listed (`GET /v1/models`) when none were configured."""
    engine_load: dict[str, float] = field(default_factory=dict)
    """The engine's own gauges from its `/metrics` (running, queued, cache hit rate), when it has them."""
    engine_speculation: UpstreamSpeculation | None = None
    """The engine's own speculative-decoding figures from its `/metrics`, when it speculates."""
    responses_api: bool = False
    """Serves `POST /v1/responses` itself (configured, or detected by the pool at start)."""
    kv_events: KvEventFeed | None = None
    """The exact block index from the engine's KV events: configured (`spec.kv_events`) or discovered."""
    kv_events_discovery: str | None = None
    """Why discovery follows no KV events of this worker (None: not asked, or it does)."""
    _prefills: deque[InFlight] = field(default_factory=deque)

    @classmethod
    def create(
        cls,
        worker_id: str,
        spec: WorkerSpec,
        engine: Engine,
        breaker: BreakerSettings,
        capacity_tokens: int,
        capacity_source: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> Worker:
        """A worker with an empty tree that follows `clock` (for TTLs)."""
        return cls(
            id=worker_id,
            spec=spec,
            engine=engine,
            breaker=CircuitBreaker(breaker, clock),
            capacity_tokens=capacity_tokens,
            capacity_source=capacity_source,
            tree=RadixTree(clock=clock),
            capacity_estimate=float(capacity_tokens),
            kv_events=KvEventFeed(spec.kv_events, clock) if spec.kv_events is not None else None,
        )

    @property
    def weight(self) -> float:
        return self.spec.weight

    @property
    def models(self) -> list[str]:
        """Configured models, else the ones the engine listed."""
        return self.spec.models or self.discovered_models

    def serves(self, model: str) -> bool:
        """True when the worker serves `model` (a worker with no known models serves all)."""
        models = self.models
        return not models or model in models

    def available(self, *, ignore_breaker: bool = False) -> bool:
        """May take a new request now: not draining, not down, below its limit, and (unless
        `ignore_breaker`) its circuit not open."""
        if self.draining or self.health == "down":
            return False
        limit = self.spec.max_concurrency
        if limit is not None and self.in_flight >= limit:
            return False
        return ignore_breaker or self.breaker.allows()

    @property
    def load(self) -> float:
        """Queued work divided by weight: what load-aware policies compare."""
        return self.queued_work / self.spec.weight

    def match(self, tokens: array[int]) -> int:
        """Tokens of `tokens` the tree predicts the engine holds. A look, not a use: the tree's LRU
        order stays the engine's, which only the worker the request goes to sees used (`remember`)."""
        return self.tree.match_prefix(tokens, touch=False).length

    def exact_match(
        self, engine_tokens: array[int] | None, salt: str, keys: dict[int, list[bytes]]
    ) -> int | None:
        """Tokens of the prompt the engine's KV events say it holds (on any of its data-parallel
        ranks), or None when the worker has no live event feed or the prompt's tokens are not the
        engine's (a byte-routed model). `keys` caches the prompt's block keys per block size across
        workers."""
        feed = self.kv_events
        if feed is None or engine_tokens is None or not feed.live():
            return None
        size = feed.block_size
        if size not in keys:
            keys[size] = chain_keys(engine_tokens, salt, size) if size > 0 else []
        return feed.match_keys(keys[size])

    @property
    def tree_limit(self) -> int:
        """The tree's size limit in its own keys: the capacity estimate times `units_per_token`."""
        return int(self.capacity_estimate * self.units_per_token)

    @property
    def free_tokens(self) -> float:
        """Engine tokens the tree predicts are still free in the engine's cache (its capacity
        estimate less what it holds; below 0 just before a trim)."""
        return self.capacity_estimate - self.tree.total_tokens / self.units_per_token

    def scale_for(self, model: str, kind: str) -> float:
        """Tree keys per engine token for a request of `model` tokenized by `kind`, which also sets
        the tree's own scale (one model per worker is the rule; with several, the latest request's
        sizes the tree)."""
        scale = self.bytes_per_token.get(model, DEFAULT_BYTES_PER_TOKEN) if kind == "bytes" else 1.0
        self.units_per_token = scale
        return scale

    def learn_bytes_per_token(self, model: str, prompt_bytes: int, prompt_tokens: int) -> None:
        """Fold one request's prompt bytes per reported prompt token into the model's figure."""
        if prompt_bytes <= 0 or prompt_tokens <= 0:
            return
        sample = prompt_bytes / prompt_tokens
        known = self.bytes_per_token.get(model)
        self.bytes_per_token[model] = (
            sample if known is None else known + BYTES_PER_TOKEN_SMOOTHING * (sample - known)
        )

    def remember(self, tokens: array[int]) -> bool:
        """Record that the engine will hold `tokens`; True when the tree has outgrown its capacity
        estimate and needs a `trim` (which the pool runs after the decision, off the request's path)."""
        self.tree.insert(tokens)
        return self.tree.total_tokens > self.tree_limit

    def trim(self) -> None:
        """Evict least recently used prefixes until the tree is a margin below its capacity estimate;
        the margin makes the (leaf-scanning) eviction run rarely."""
        limit = self.tree_limit
        if self.tree.total_tokens > limit:
            self.tree.evict(self.tree.total_tokens - int(limit * (1 - DEFAULT_EVICT_HEADROOM)))

    def charge(self, prefill: float, decode: float, prefill_hold_s: float, now: float) -> InFlight:
        """Count one dispatched request: its prefill stays queued work for `prefill_hold_s`, its decode
        until it ends. (A prefill long done must not make a worker look busy for the request's whole life.)"""
        self.in_flight += 1
        self.requests += 1
        self.queued_work += prefill + decode
        self.breaker.on_dispatch()
        charge = InFlight(prefill=prefill, decode=decode, expires=now + prefill_hold_s)
        self._prefills.append(charge)
        return charge

    def prefill_wait(self, now: float) -> float:
        """Seconds until the prefill already sent here should be done (what a new request's prefill
        queues behind: engines run prefill before decode)."""
        return max(0.0, self.prefill_free_at - now)

    def prefill_backlog(self, now: float, tokens_per_s: float) -> float:
        """Tokens of the prefill already sent here that should still be computing (the prefill
        queue's remaining seconds at the configured speed)."""
        return self.prefill_wait(now) * tokens_per_s * self.weight

    def queue_prefill(self, tokens: float, tokens_per_s: float, now: float) -> None:
        """Add one dispatched request's uncached prompt to the worker's prefill queue."""
        self.prefill_free_at = max(now, self.prefill_free_at) + tokens / (tokens_per_s * self.weight)

    def expire_prefills(self, now: float) -> None:
        """Drop prefills whose hold has passed (dispatch order is expiry order: one deque suffices)."""
        prefills = self._prefills
        while prefills and prefills[0].expires <= now:
            charge = prefills.popleft()
            if charge.pending:
                charge.pending = False
                self.queued_work = max(0.0, self.queued_work - charge.prefill)

    def settle(self, charge: InFlight, *, failed: bool) -> None:
        """Uncount a request that ended."""
        self.in_flight -= 1
        done = charge.decode + (charge.prefill if charge.pending else 0.0)
        charge.pending = False
        self.queued_work = max(0.0, self.queued_work - done)
        if failed:
            self.failures += 1
        self.breaker.record(failed=failed)

    def correct(self, prompt_tokens: int, predicted: int, cached: int) -> None:
        """Compare the tree's prediction with the engine's `cached_tokens` and adapt the tree's size."""
        self.predicted_tokens += predicted
        self.reported_cached_tokens += cached
        self.predictions += 1
        self.prediction_error_tokens += abs(predicted - cached)
        if predicted - cached > max(MISPREDICTION_MIN_TOKENS, MISPREDICTION_TOLERANCE * prompt_tokens):
            self.mispredictions += 1
            floor = MIN_CAPACITY_FRACTION * self.capacity_tokens
            self.capacity_estimate = max(floor, self.capacity_estimate * SHRINK_FACTOR)
            if self.tree.total_tokens > self.tree_limit:
                self.tree.evict(self.tree.total_tokens - self.tree_limit)
        else:
            self.capacity_estimate = min(float(self.capacity_tokens), self.capacity_estimate * GROW_FACTOR)

    def set_capacity(self, capacity_tokens: int, source: str) -> None:
        """Resize the tree to a capacity the engine reported."""
        self.capacity_tokens = capacity_tokens
        self.capacity_source = source
        self.capacity_estimate = float(capacity_tokens)
        if self.tree.total_tokens > self.tree_limit:
            self.tree.evict(self.tree.total_tokens - self.tree_limit)

    def forget(self) -> None:
        """Drop the whole tree (the engine restarted or flushed its cache)."""
        self.tree.clear()

    def tree_memory_bytes(self) -> int:
        """Approximate bytes held by the tree: 4 per token key plus a fixed cost per node."""
        return 4 * self.tree.total_tokens + NODE_OVERHEAD_BYTES * self.tree.node_count


NODE_OVERHEAD_BYTES = 400
"""Bytes per tree node beyond its 4-byte token keys: a `RadixNode`, its children dict, its key bytes
object and the parent's dict entry on CPython 3.11 (tracemalloc), rounded up."""
