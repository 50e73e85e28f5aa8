"""The default policy: send a request where its prefix KV lives, unless that worker is too busy.

For a prompt of L tokens and each available worker w, with m_w the prefix its tree predicts cached
and Q_w its queued work (below), the cost is

    cost_w = (prefill_weight * (L - m_w) + Q_w) / weight_w

    Q_w = sum over w's in-flight requests r of (uncached_r * [dispatched < prefill_hold_s ago]
                                                + decode_weight * expected_output_r)

Both terms are in tokens of work: L - m_w is the prefill this request would add on w, Q_w what
already waits there. So a long match wins only while the work it saves exceeds the extra queue it
joins, which is what keeps multi-turn chats that all share one system prompt from piling onto the
first worker that cached it: once every worker holds the system prompt, the matches differ only by
each conversation's own history and the queues decide (like NVIDIA Dynamo's KV router, unlike a
match-ratio threshold). Two guards follow SGLang's router:

- if the best match ratio max_w(m_w) / L is below `match_threshold`, nothing worth keeping is cached
  anywhere: take the least-loaded worker (and its tree grows there);
- a worker whose Q_w exceeds the least-loaded one's by more than `imbalance_abs_tokens` *and* by the
  factor `imbalance_rel` is not a candidate, however good its match.

Ties go to fewer in-flight requests, then rotate, so an idle cluster fills evenly.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.routing.config import CacheAwareSettings
from proxy.routing.policies import Decision, RoutingContext, least_loaded
from proxy.routing.worker import Worker


class CacheAware:
    """Longest predicted prefix match weighed against queued work."""

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
        min_work = min(w.queued_work for w in candidates)
        pool = [
            w
            for w in candidates
            if not (
                w.queued_work - min_work > settings.imbalance_abs_tokens
                and w.queued_work > settings.imbalance_rel * min_work
            )
        ]
        matches = {w.id: w.match(tokens) for w in pool}
        best = max(matches.values())
        if best / length < settings.match_threshold:
            worker = least_loaded(pool, self._rotation)
            reason = "imbalance" if len(pool) < len(candidates) else "least_load"
            return Decision(worker=worker, match_tokens=matches[worker.id], reason=reason, matches=matches)
        count = len(pool)
        order = [pool[(self._rotation + i) % count] for i in range(count)]
        worker = min(
            order,
            key=lambda w: (
                (settings.prefill_weight * (length - matches[w.id]) + w.queued_work) / w.weight,
                w.in_flight / w.weight,
            ),
        )
        return Decision(worker=worker, match_tokens=matches[worker.id], reason="best_cost", matches=matches)
