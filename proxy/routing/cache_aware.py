"""The default policy: send a request where its prefix KV lives, within a bound on every worker's load.

All lengths are in the engine's tokens (a byte tree's keys are divided by the learned bytes per
token: `RoutingContext.units_per_token`). For a prompt of L tokens and each worker w, with m_w the
prefix it holds (from its engine's KV events when it has a live feed, or the approximate tree's
prediction when that is longer: the tree already holds what was just sent there and is not stored
yet), F_w the free room its tree predicts in its engine's cache and Q_w its queued work:

    cost_w = ((L - m_w) + E_w + Q_w) / weight_w
    E_w    = min(L - m_w, max(0, (L - m_w) - F_w))

    Q_w = P_w + sum over w's in-flight requests r of (decode_weight * expected_output_r
                                                      + uncached_r * [dispatched < prefill_hold_s ago])

with P_w the prefill sent to w that its engine has not computed yet: each dispatched request's
uncached tokens join a queue that drains at `prefill_tokens_per_s` times the worker's weight
(`prefill_hold_s`, 0 by default, can hold them longer). P_w counts unless w holds more of the
prompt than every other candidate: a request whose prefix only w holds, or is still computing (a
burst for a new prefix, a conversation's history), waits for that prefix rather than behind the
whole queue, and would cost more work anywhere else; one that would reuse as much elsewhere (nothing
at all, or a system prompt every worker holds) costs the same work anywhere, so it goes where it
waits least. (Charged only for misses, the prefill queue left closed-loop chats in lockstep: a
worker whose group of conversations ended together took all their users' next conversations at once.)

Every term is tokens of work: L - m_w is the prefill this request adds on w, E_w the cached prefix
it evicts there to make room (recomputed later, by whoever asks for it again: a miss in a full cache
costs twice its prefill, in a cache with room once), Q_w what already waits there: the prefill still
to compute, which is what a burst of misses piles up, and the decode. So a long match
wins only while the work it saves exceeds the extra queue it joins (like NVIDIA Dynamo's KV router),
and a prompt cached nowhere goes where it evicts least, then to the least queued work: new prefixes
fill the caches evenly, as sglang-router's "smallest tree" does, and with nothing shared at all the
policy is least-load.

The cost is taken only over the workers within the load bound (consistent hashing with bounded
loads, Mirrokni et al. 2018): with N requests in flight over workers of total weight W, worker w
may take one more while

    in_flight_w < ceil((1 + load_epsilon) * (N + 1) * weight_w / W)

so no worker exceeds (1 + ε) times the mean load while another has room; and while any worker is
above the mean, an idle worker takes the next request whatever its prefix (a prefix all traffic
shares would otherwise leave a worker without work, since a miss there always costs more than one
more request in a warm worker's queue). That is also what spreads a hot prefix: once the worker
holding it is at its bound, the next request for it goes to the cheapest worker with room, whose tree
then holds the prefix too, and the prefix's later requests weigh both (then a third...). Prefixes
whose demand fits one worker keep their affinity. The one formula has no per-workload constant: ε is
a fairness bound (1: twice the mean), decode_weight a ratio of work.

- if the best match ratio max_w(m_w) / L over the workers within the bound is below
  `match_threshold`, nothing worth keeping is cached there: no match counts (the decision's reason
  is `new_prefix`, or `bounded_load` when a worker at its bound holds it).
- an optional TTFT guard (`ttft_slack_s`, off by default) keeps only the workers whose expected wait
  for this request's first token, `wait_w = D_w + (L - m_w) / (weight_w * prefill_tokens_per_s)`
  with D_w the prefill already queued there, is within the slack of the fastest's.

Ties go to fewer in-flight requests, then rotate, so an idle cluster fills evenly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from proxy.routing.config import CacheAwareSettings
from proxy.routing.policies import Decision, RoutingContext, least_loaded
from proxy.routing.worker import Worker

SAME_MATCH_TOKENS = 16.0
"""Matches this close are the same reuse (a KV page: engines cache whole pages)."""


def within_bound(candidates: Sequence[Worker], epsilon: float) -> list[Worker]:
    """The candidates that may take one more request under the bounded-load rule (never empty): those
    below (1 + epsilon) of the mean in-flight load per weight, counting this request; and of those, an
    idle worker while another is above the mean (a prefix all traffic shares must not leave one idle)."""
    total_weight = sum(w.weight for w in candidates)
    mean = (sum(w.in_flight for w in candidates) + 1) / total_weight
    room = [w for w in candidates if w.in_flight < math.ceil((1 + epsilon) * mean * w.weight - 1e-9)]
    if any(w.in_flight > mean * w.weight for w in candidates):
        idle = [w for w in room if w.in_flight == 0]
        if idle:
            return idle
    return room or list(candidates)


class CacheAware:
    """Longest predicted prefix match weighed against queued work, within a load bound."""

    name = "cache_aware"
    needs_tokens = True

    def __init__(self, settings: CacheAwareSettings) -> None:
        self.settings = settings
        self._rotation = 0

    def choose(self, candidates: Sequence[Worker], context: RoutingContext) -> Decision:
        self._rotation += 1
        tokens = context.tokens
        length = len(tokens)
        if length == 0:
            return Decision(worker=least_loaded(candidates, self._rotation), reason="least_load")
        settings = self.settings
        pool = within_bound(candidates, settings.load_epsilon)
        bounded = len(pool) < len(candidates)
        # Each worker's cached fraction of the prompt: from its KV events when live, else its tree.
        keys = context.block_keys
        exact = {w.id: w.exact_match(context.engine_tokens, context.salt, keys) for w in candidates}
        events_length = max(1, len(context.engine_tokens or ()))
        ratios = {}
        for w in candidates:
            held, predicted = exact[w.id], w.match(tokens) / length
            # Events say what the engine stores; the tree also holds what was just sent there and is
            # not stored yet (a burst for a new prefix arrives before its first prefill is done).
            ratios[w.id] = predicted if held is None else max(held / events_length, predicted)
        # Lengths and matches in the engine's tokens (a byte tree's keys divided by bytes per token).
        lengths = {w.id: length / context.units_per_token.get(w.id, 1.0) for w in candidates}
        matches = {w.id: ratios[w.id] * lengths[w.id] for w in candidates}
        best = max(ratios.values())
        # Nothing worth keeping is cached on a worker with room: no match counts, only room and load.
        new_prefix = max(ratios[w.id] for w in pool) < settings.match_threshold
        counted = dict.fromkeys(matches, 0.0) if new_prefix else matches
        count = len(pool)
        order = [pool[(self._rotation + i) % count] for i in range(count)]
        fast = order
        if settings.ttft_slack_s != math.inf:
            # TTFT guard, in seconds of prefill ahead of this request's first token on each worker.
            waits = {
                w.id: w.prefill_wait(context.now)
                + (lengths[w.id] - counted[w.id]) / (w.weight * settings.prefill_tokens_per_s)
                for w in order
            }
            cutoff = min(waits.values()) + settings.ttft_slack_s
            fast = [w for w in order if waits[w.id] <= cutoff]

        ranked = [*sorted((counted[w.id] for w in order), reverse=True), 0.0]  # the best two, and 0

        def cost(w: Worker) -> tuple[float, float]:
            uncached = lengths[w.id] - counted[w.id]
            # The prefix it evicts to make room: recomputed later (by someone) if it is asked again.
            evicted = min(uncached, max(0.0, uncached - w.free_tokens))
            queued = w.queued_work
            elsewhere = ranked[1] if counted[w.id] >= ranked[0] else ranked[0]
            if counted[w.id] <= elsewhere + SAME_MATCH_TOKENS:
                # It reuses here no more than it would elsewhere: it only waits behind the prefill
                # still computing there (which, where it holds more, is its own prefix's).
                queued += w.prefill_backlog(context.now, settings.prefill_tokens_per_s)
            return (uncached + evicted + queued) / w.weight, w.in_flight / w.weight

        costs = {w.id: cost(w) for w in order}
        worker = min(fast, key=lambda w: costs[w.id])
        if len(fast) < count and costs[worker.id] > min(costs.values()):
            reason = "ttft"
        elif bounded and best >= settings.match_threshold and ratios[worker.id] < best:
            reason = "bounded_load"  # the best match was at its bound: this worker warms the prefix
        else:
            reason = "new_prefix" if new_prefix else "best_cost"
        return _decision(worker, reason, matches, exact)


def _decision(
    worker: Worker, reason: str, matches: dict[str, float], exact: dict[str, int | None]
) -> Decision:
    rounded = {worker_id: round(tokens) for worker_id, tokens in matches.items()}
    source = "tree" if exact.get(worker.id) is None else "events"
    return Decision(
        worker=worker, match_tokens=rounded[worker.id], reason=reason, matches=rounded, source=source
    )
