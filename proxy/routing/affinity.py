"""Conversation affinity: a turn goes to the worker that served the previous one, while its load allows.

A front door that knows where a conversation's KV lives (`/v1/responses` with `previous_response_id`)
names that worker in `EngineRequest.route.prefer_worker`. The pool keeps the request there unless
that worker is unavailable or outside the load bound the cache_aware policy applies to every candidate
(`cache_aware.within_bound`: at most (1 + `load_epsilon`) times the mean, and no other worker idle
while it is above the mean); then the policy chooses as usual. Unlike the routing tree's
prediction, the hint holds however long the history, whatever was evicted from the tree, and under
any policy. A hint marked `required` (a conversation whose state the worker itself stores, for a
worker that serves `/v1/responses` natively) admits that worker only.
"""

from __future__ import annotations

from collections.abc import Sequence

from adapters.base import EngineRequest
from proxy.routing.cache_aware import within_bound
from proxy.routing.config import CacheAwareSettings
from proxy.routing.worker import Worker

AFFINITY_REASON = "previous_turn"
"""The routing decision's reason when the hint was followed."""


def preferred_worker(
    request: EngineRequest, candidates: Sequence[Worker], settings: CacheAwareSettings
) -> Worker | None:
    """The hinted worker when it is a candidate and its load allows; None: let the policy choose."""
    route = request.route
    if route is None or route.prefer_worker is None:
        return None
    worker = next((w for w in candidates if w.id == route.prefer_worker), None)
    if worker is None or route.required:
        return worker
    return worker if worker in within_bound(candidates, settings.load_epsilon) else None
