"""Routing policies, chosen by name. Each picks one worker from the available candidates.

    round_robin    next worker in turn
    random         uniform (weighted by `weight`)
    power_of_two   two random workers, the less loaded one
    least_load     the least queued work per unit of weight
    session        consistent hashing of the request's `user`, so one user keeps one worker
    cache_aware    longest predicted prefix match against load (`proxy.routing.cache_aware`)

Every policy sees the same `RoutingContext`; only cache_aware reads the token ids.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from proxy.routing.worker import Worker

SESSION_VIRTUAL_NODES = 64
"""Points per unit of weight on the consistent-hash ring; more points, smoother spread."""


@dataclass(slots=True)
class RoutingContext:
    """What a policy knows about the request."""

    tokens: array[int]
    """Token ids of the chat-templated prompt, salted by tenant (empty for policies that skip tokenizing)."""
    expected_output: int
    """Output tokens the request may generate (its `max_tokens`, or the configured default)."""
    session_key: str | None = None
    """The `user` field, for the session policy."""
    now: float = 0.0
    """The pool's clock at the decision (for the cache_aware TTFT guard's prefill queues)."""
    engine_tokens: array[int] | None = None
    """The prompt's token ids without the salt pseudo-token, when they are the engine's own (an
    exact tokenizer): what KV-event indexes match. None for a byte-routed prompt."""
    salt: str = ""
    """The tenant's cache salt (the first block's extra key in KV-event indexes)."""
    block_keys: dict[int, list[bytes]] = field(default_factory=dict)
    """`kv_index.chain_keys` of `engine_tokens` per block size, computed once for all workers."""
    units_per_token: dict[str, float] = field(default_factory=dict)
    """Per worker id, `tokens` keys per engine token (bytes per token for a byte-routed model);
    a missing worker's is 1. Dividing by it puts lengths and matches in the engine's tokens."""


@dataclass(slots=True)
class Decision:
    """A policy's choice and what it saw, for the routing span and the lease."""

    worker: Worker
    match_tokens: int = 0
    """Prompt tokens (the engine's) the chosen worker's tree predicted as cached."""
    reason: str = ""
    """Why this worker: "best_cost", "least_load", "bounded_load", "hash", "turn", ..."""
    source: str = "tree"
    """Where the chosen worker's match came from: "tree" (approximate) or "events" (KV events)."""
    matches: dict[str, int] = field(default_factory=dict)


class Policy(Protocol):
    """Chooses a worker among `candidates` (non-empty, all available)."""

    name: str
    needs_tokens: bool
    """True when the policy reads `RoutingContext.tokens` (the router tokenizes only then)."""

    def choose(self, candidates: Sequence[Worker], context: RoutingContext) -> Decision: ...


def least_loaded(candidates: Sequence[Worker], rotation: int = 0) -> Worker:
    """Least queued work per weight; ties go to fewer in-flight requests, then rotate."""
    count = len(candidates)
    return min(
        (candidates[(rotation + i) % count] for i in range(count)),
        key=lambda w: (w.load, w.in_flight / w.weight),
    )


class RoundRobin:
    name = "round_robin"
    needs_tokens = False

    def __init__(self) -> None:
        self._next = 0

    def choose(self, candidates: Sequence[Worker], context: RoutingContext) -> Decision:
        worker = candidates[self._next % len(candidates)]
        self._next += 1
        return Decision(worker=worker, reason="turn")


class RandomChoice:
    name = "random"
    needs_tokens = False

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(self, candidates: Sequence[Worker], context: RoutingContext) -> Decision:
        worker = self._rng.choices(list(candidates), weights=[w.weight for w in candidates])[0]
        return Decision(worker=worker, reason="random")


class PowerOfTwo:
    name = "power_of_two"
    needs_tokens = False

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(self, candidates: Sequence[Worker], context: RoutingContext) -> Decision:
        if len(candidates) == 1:
            return Decision(worker=candidates[0], reason="only")
        pair = self._rng.sample(list(candidates), 2)
        return Decision(worker=least_loaded(pair), reason="two_choices")


class LeastLoad:
    name = "least_load"
    needs_tokens = False

    def __init__(self) -> None:
        self._rotation = 0

    def choose(self, candidates: Sequence[Worker], context: RoutingContext) -> Decision:
        self._rotation += 1
        return Decision(worker=least_loaded(candidates, self._rotation), reason="least_load")


class Session:
    """Consistent hashing: adding or removing a worker moves only the sessions that hashed to it."""

    name = "session"
    needs_tokens = False

    def __init__(self) -> None:
        self._ring: list[tuple[int, str]] = []
        self._ring_ids: frozenset[str] = frozenset()
        self._fallback = LeastLoad()

    def choose(self, candidates: Sequence[Worker], context: RoutingContext) -> Decision:
        if context.session_key is None:
            decision = self._fallback.choose(candidates, context)
            decision.reason = "no_session"
            return decision
        by_id = {w.id: w for w in candidates}
        if frozenset(by_id) != self._ring_ids:
            self._rebuild(candidates)
        point = _hash64(context.session_key)
        index = bisect.bisect(self._ring, (point, ""))
        worker_id = self._ring[index % len(self._ring)][1]
        return Decision(worker=by_id[worker_id], reason="hash")

    def _rebuild(self, candidates: Sequence[Worker]) -> None:
        ring = []
        for worker in candidates:
            points = max(1, round(SESSION_VIRTUAL_NODES * worker.weight))
            ring += [(_hash64(f"{worker.id}#{i}"), worker.id) for i in range(points)]
        self._ring = sorted(ring)
        self._ring_ids = frozenset(w.id for w in candidates)


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
