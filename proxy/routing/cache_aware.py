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
match-ratio threshold). Guards, after SGLang's router:

- if the best match ratio max_w(m_w) / L is below `match_threshold`, nothing worth keeping is cached
  anywhere: take the least-loaded worker (and its tree grows there);
- a worker whose Q_w exceeds the least-loaded one's by more than `imbalance_abs_tokens` *and* by the
  factor `imbalance_rel` is not a candidate, however good its match;
- nor is one whose in-flight requests (per unit of weight) exceed the least busy one's by more than
  `balance_abs_requests` *and* by the factor `balance_rel`. Queued work alone never fills an idle
  worker: decode weighs little, so a miss there (2 x the prompt) always looks dearer than joining a
  busy worker's batch, and with requests arriving one by one a worker could stay idle for good.

The cost is throughput (work done anywhere); a TTFT guard can keep the first token fast. Each worker
keeps a prefill queue in time: every dispatched request adds its uncached tokens at
`prefill_tokens_per_s` (times the worker's weight) behind the ones before it, so with D_w the seconds
until w's queued prefill is done, this request's first token on w comes after about

    wait_w = D_w + (L - m_w) / (weight_w * prefill_tokens_per_s)    seconds

(engines run prefill before decode), and only workers with wait_w <= min_v wait_v + `ttft_slack_s`
are candidates. A conversation then stays with the worker holding its history unless other
requests' prefills just piled up there and another worker could recompute the whole history sooner;
a burst of new requests for a prefix one worker is still computing spreads once waiting for it costs
more than the slack (a match whose prefill is still queued waits for it in D_w, so it never looks free).
The guard is off by default (`ttft_slack_s = inf`): see `CacheAwareSettings.ttft_slack_s`.

Ties go to fewer in-flight requests, then rotate, so an idle cluster fills evenly.
"""

from __future__ import annotations

import math
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
        min_busy = min(w.in_flight / w.weight for w in candidates)
        pool = [
            w
            for w in candidates
            if not (
                w.queued_work - min_work > settings.imbalance_abs_tokens
                and w.queued_work > settings.imbalance_rel * min_work
            )
            and not (
                w.in_flight / w.weight - min_busy > settings.balance_abs_requests
                and w.in_flight / w.weight > settings.balance_rel * min_busy
            )
        ]
        scale = context.units_per_token
        # Matches and lengths in the engine's tokens (a byte tree's keys divided by bytes per token).
        matches = {w.id: w.match(tokens) / scale.get(w.id, 1.0) for w in pool}
        lengths = {w.id: length / scale.get(w.id, 1.0) for w in pool}
        best = max(matches[w.id] / lengths[w.id] for w in pool)
        if best < settings.match_threshold:
            worker = least_loaded(pool, self._rotation)
            reason = "imbalance" if len(pool) < len(candidates) else "least_load"
            return _decision(worker, reason, matches)
        count = len(pool)
        order = [pool[(self._rotation + i) % count] for i in range(count)]
        fast = order
        if settings.ttft_slack_s != math.inf:
            # TTFT guard, in seconds of prefill ahead of this request's first token on each worker.
            waits = {
                w.id: w.prefill_wait(context.now)
                + (lengths[w.id] - matches[w.id]) / (w.weight * settings.prefill_tokens_per_s)
                for w in order
            }
            cutoff = min(waits.values()) + settings.ttft_slack_s
            fast = [w for w in order if waits[w.id] <= cutoff]

        def cost(w: Worker) -> tuple[float, float]:
            work = (settings.prefill_weight * (lengths[w.id] - matches[w.id]) + w.queued_work) / w.weight
            return work, w.in_flight / w.weight

        worker = min(fast, key=cost)
        reason = "best_cost" if len(fast) == count or cost(worker) <= min(map(cost, order)) else "ttft"
        return _decision(worker, reason, matches)


def _decision(worker: Worker, reason: str, matches: dict[str, float]) -> Decision:
    rounded = {worker_id: round(tokens) for worker_id, tokens in matches.items()}
    return Decision(worker=worker, match_tokens=rounded[worker.id], reason=reason, matches=rounded)
