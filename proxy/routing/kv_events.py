"""A worker's KV-event feed: subscribe to its engine's events, replay gaps, keep its block index.

One asyncio task per worker with `kv_events` configured: a pyzmq SUB socket on `endpoint` (topic
`topic`) receives `[topic, seq, EventBatch]` messages (`proxy.routing.kv_wire`). Sequence numbers
must follow each other: a gap is asked for again on the `replay_endpoint` (a DEALER to the engine's
ROUTER); a gap that cannot be replayed (no replay socket, or the engine's buffer no longer has it)
resets the index, which then rebuilds from the next events, since a lost removal would otherwise
leave it claiming blocks the engine dropped. A live sequence number at or below the last one means
the engine restarted (its numbering began again, its cache empty): the index starts over. (A worker
marked down keeps its index: a health check that timed out under load says nothing about the
cache, and a restart shows in the numbering.) `AllBlocksCleared` empties the index.

The feed is live while events keep answering dispatched requests: once a request dispatched to the
worker has gone `stale_after_s` without any event after it, the router falls back to the worker's
approximate tree until events arrive again (an engine restarted without events, a lost connection).
Every gateway replica subscribes to the same events, so N replicas hold the same index and route alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from proxy.routing.config import KvEventsSpec
from proxy.routing.kv_index import KvBlockIndex
from proxy.routing.kv_wire import END_OF_REPLAY, WireError, decode_batch, decode_seq, encode_seq

logger = logging.getLogger("radixgate.routing.kv_events")

REPLAY_TIMEOUT_S = 2.0
"""Seconds a replay request may take before the gap counts as lost."""


@dataclass(slots=True)
class KvEventFeed:
    """The index of one worker's engine blocks and the state of its subscription."""

    spec: KvEventsSpec
    clock: Callable[[], float]
    source: str = "config"
    """"config", or what discovery found (`proxy.routing.kv_discovery`)."""
    index: KvBlockIndex = field(default_factory=KvBlockIndex)
    last_seq: int | None = None
    last_event_at: float | None = None
    unanswered_since: float | None = None
    """When the oldest request dispatched since the last event was sent (None: none waits)."""
    replayed: int = 0
    """Batches recovered through the replay socket."""
    resets: int = 0
    """Gaps that could not be replayed (the index was cleared)."""
    malformed: int = 0

    def live(self) -> bool:
        """True while the index can be trusted for routing (see the module docstring)."""
        if self.last_event_at is None:
            return False
        waiting = self.unanswered_since
        return waiting is None or self.clock() - waiting <= self.spec.stale_after_s

    def dispatched(self) -> None:
        """A request was sent to the worker: its blocks should show up as events soon."""
        if self.unanswered_since is None:
            self.unanswered_since = self.clock()

    def receive(self, seq: int, payload: bytes) -> None:
        """Apply one batch in sequence order (the caller has filled any gap before it)."""
        if self.last_seq is not None and seq <= self.last_seq:
            return  # already applied (a replay answers from where it was asked)
        self.last_seq = seq
        try:
            events = decode_batch(payload)
        except WireError as exc:
            self.malformed += 1
            logger.warning("undecodable KV event batch %d: %s", seq, exc)
            return
        for event in events:
            self.index.apply(event)
        self.last_event_at = self.clock()
        self.unanswered_since = None

    def restarted(self) -> None:
        """The engine restarted: its cache is empty and its numbering starts again."""
        self.index.clear()
        self.last_seq = None

    def lost(self) -> None:
        """A gap could not be replayed: forget everything (a lost removal would mislead routing)."""
        self.resets += 1
        self.index.clear()

    async def run(self, context: zmq.asyncio.Context | None = None) -> None:
        """Subscribe and apply events until cancelled."""
        context = context or zmq.asyncio.Context.instance()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.spec.topic.encode())
        try:
            sub.connect(self.spec.endpoint)
        except zmq.ZMQError as exc:  # the approximate tree keeps routing this worker
            logger.warning("cannot subscribe to KV events at %s: %s", self.spec.endpoint, exc)
            sub.close()
            return
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.malformed += 1
                    continue
                seq = decode_seq(frames[1])
                if self.last_seq is not None and seq <= self.last_seq:
                    logger.info("KV events of %s numbered afresh: the engine restarted", self.spec.endpoint)
                    self.restarted()
                elif self.last_seq is not None and seq > self.last_seq + 1:
                    await self._fill_gap(context, self.last_seq + 1, seq)
                self.receive(seq, frames[2])
        finally:
            sub.close()

    async def _fill_gap(self, context: zmq.asyncio.Context, start: int, until: int) -> None:
        """Replay batches `start` .. `until - 1`; when that fails, reset the index (see `lost`)."""
        recovered = False
        if self.spec.replay_endpoint is not None:
            try:
                recovered = await self._replay(context, start, until)
            except TimeoutError:
                logger.warning("KV event replay from %d timed out", start)
        if not recovered:
            logger.warning("KV events %d..%d lost; index reset", start, until - 1)
            self.lost()
            self.last_seq = until - 1

    async def _replay(self, context: zmq.asyncio.Context, start: int, until: int) -> bool:
        """True when every batch of the gap came back, in order, and was applied."""
        assert self.spec.replay_endpoint is not None
        replay = context.socket(zmq.DEALER)
        replay.setsockopt(zmq.LINGER, 0)
        replay.connect(self.spec.replay_endpoint)
        expected = start
        try:
            await replay.send_multipart([b"", encode_seq(start)])
            async with asyncio.timeout(REPLAY_TIMEOUT_S):
                while True:
                    frames = await replay.recv_multipart()
                    if len(frames) != 3 or len(frames[1]) != 8:
                        continue
                    seq = decode_seq(frames[1])
                    if seq == END_OF_REPLAY:
                        break
                    if seq < expected or seq >= until:
                        continue  # before the gap, or after it (the live stream brings those)
                    if seq > expected:
                        return False  # the engine's buffer no longer holds the missing batches
                    self.receive(seq, frames[2])
                    self.replayed += 1
                    expected += 1
        finally:
            replay.close()
        return expected == until


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel a feed's task and wait for it."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
