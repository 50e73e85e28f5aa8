"""A worker's KV-event feed: its engine's event streams, one per data-parallel rank, as one index.

One asyncio task per worker with `kv_events` configured or discovered. An engine run with data
parallelism (vLLM `--data-parallel-size N`, SGLang `--dp-size N --enable-dp-attention`) runs N
schedulers, each with its own KV cache and its own publisher on the configured addresses offset by
its rank (`tcp://h:5557` -> `tcp://h:5558` for rank 1; the replay socket likewise); the engine's
API server spreads requests over them. The feed follows one stream per rank
(`proxy.routing.kv_stream`: sequence numbers, replays and resets are each rank's own) and indexes
them as the one worker the gateway routes to: a prompt's cached prefix is the longest any rank holds,
since the request may land on that rank (a rank's blocks count for its worker).

The feed is live while events keep answering dispatched requests: once a request dispatched to the
worker has gone `stale_after_s` without any event after it, from any rank, the router falls back to
the worker's approximate tree until events arrive again (an engine restarted without events, a lost
connection). Every gateway replica subscribes to the same events, so N replicas hold the same index
and route alike. (A worker marked down keeps its index: a health check that timed out under load
says nothing about the cache, and a restart shows in the numbering.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import zmq.asyncio

from proxy.routing.config import KvEventsSpec
from proxy.routing.kv_stream import KvEventStream, rank_endpoint


@dataclass(slots=True)
class KvEventFeed:
    """The blocks one worker's engine holds, over all its ranks, and whether they can be trusted."""

    spec: KvEventsSpec
    clock: Callable[[], float]
    source: str = "config"
    """"config", or what discovery found (`proxy.routing.kv_discovery`)."""
    streams: list[KvEventStream] = field(default_factory=list)
    """One per data-parallel rank in `spec.data_parallel_ranks`, in rank order."""
    last_event_at: float | None = None
    unanswered_since: float | None = None
    """When the oldest request dispatched since the last event was sent (None: none waits)."""

    def __post_init__(self) -> None:
        if not self.streams:
            spec = self.spec
            self.streams = [
                KvEventStream(
                    endpoint=rank_endpoint(spec.endpoint, rank),
                    replay_endpoint=None
                    if spec.replay_endpoint is None
                    else rank_endpoint(spec.replay_endpoint, rank),
                    topic=spec.topic,
                    rank=rank,
                    on_batch=self._answered,
                )
                for rank in sorted(spec.data_parallel_ranks)
            ]

    def live(self) -> bool:
        """True while the index can be trusted for routing (see the module docstring)."""
        if self.last_event_at is None:
            return False
        waiting = self.unanswered_since
        return waiting is None or self.clock() - waiting <= self.spec.stale_after_s

    def dispatched(self) -> None:
        """A request was sent to the worker: its blocks should show up as events soon (on the rank
        the engine gives it, which the gateway does not know)."""
        if self.unanswered_since is None:
            self.unanswered_since = self.clock()

    def _answered(self) -> None:
        self.last_event_at = self.clock()
        self.unanswered_since = None

    @property
    def block_size(self) -> int:
        """Tokens per block (every rank runs the same engine; 0 before the first BlockStored)."""
        return max(stream.index.block_size for stream in self.streams)

    def match_keys(self, keys: Sequence[bytes]) -> int:
        """Leading tokens any rank holds, given the prompt's chain keys at `block_size`."""
        size = self.block_size
        return max(s.index.match_keys(keys) for s in self.streams if s.index.block_size == size)

    def match(self, tokens: Sequence[int], salt: str = "") -> int:
        """Leading tokens of `tokens` (the engine's ids) that any rank holds in whole blocks."""
        return max(stream.index.match(tokens, salt) for stream in self.streams)

    @property
    def blocks(self) -> int:
        """Blocks held, summed over the ranks (each rank caches its own copy)."""
        return sum(stream.index.blocks for stream in self.streams)

    def blocks_by_medium(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for stream in self.streams:
            for medium, count in stream.index.blocks_by_medium().items():
                counts[medium] = counts.get(medium, 0) + count
        return counts

    @property
    def replayed(self) -> int:
        return sum(stream.replayed for stream in self.streams)

    @property
    def resets(self) -> int:
        return sum(stream.resets for stream in self.streams)

    async def run(self, context: zmq.asyncio.Context | None = None) -> None:
        """Follow every rank's stream until cancelled."""
        context = context or zmq.asyncio.Context.instance()
        await asyncio.gather(*(stream.run(context) for stream in self.streams))


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel a feed's task and wait for it."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
