"""One KV-event stream: a single publisher's batches, its sequence numbers, its replays, its blocks.

An engine publishes one stream per data-parallel rank (`proxy.routing.kv_events` follows them all
as one worker's feed). A pyzmq SUB socket receives `[topic, seq, EventBatch]` messages
(`proxy.routing.kv_wire`). Sequence numbers must follow each other: a gap is asked for again on the
stream's replay socket (a DEALER to the engine's ROUTER); a gap that cannot be replayed (no replay
socket, or the engine's buffer no longer has it) resets the stream's index, which then rebuilds
from the next events, since a lost removal would otherwise leave it claiming blocks the engine
dropped. A live sequence number at or below the last one means the publisher restarted (its
numbering began again, its cache empty): the index starts over. `AllBlocksCleared` empties it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from proxy.routing.kv_index import KvBlockIndex
from proxy.routing.kv_wire import END_OF_REPLAY, WireError, decode_batch, decode_seq, encode_seq

logger = logging.getLogger("radixgate.routing.kv_events")

REPLAY_TIMEOUT_S = 2.0
"""Seconds a replay request may take before the gap counts as lost."""


def rank_endpoint(endpoint: str, rank: int) -> str:
    """Where data-parallel rank `rank` publishes when the engine was given `endpoint`: vLLM's and
    SGLang's rule, the TCP port plus the rank (`tcp://h:5557` -> `tcp://h:5558` for rank 1), any
    other transport the address with `_dp<rank>` appended; rank 0 the address itself."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    return f"{endpoint}_dp{rank}"


@dataclass(slots=True)
class KvEventStream:
    """One publisher's subscription and the index of the blocks it reported."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    rank: int = 0
    """The engine's data-parallel rank that publishes here."""
    on_batch: Callable[[], None] = lambda: None
    """Called after each batch applied (the worker's feed counts any rank's events as life)."""
    index: KvBlockIndex = field(default_factory=KvBlockIndex)
    last_seq: int | None = None
    replayed: int = 0
    """Batches recovered through the replay socket."""
    resets: int = 0
    """Gaps that could not be replayed (the index was cleared)."""
    malformed: int = 0

    def receive(self, seq: int, payload: bytes) -> None:
        """Apply one batch in sequence order (the caller has filled any gap before it)."""
        if self.last_seq is not None and seq <= self.last_seq:
            return  # already applied (a replay answers from where it was asked)
        self.last_seq = seq
        try:
            events = decode_batch(payload)
        except WireError as exc:
            self.malformed += 1
            logger.warning("undecodable KV event batch %d from %s: %s", seq, self.endpoint, exc)
            return
        for event in events:
            self.index.apply(event)
        self.on_batch()

    def restarted(self) -> None:
        """The publisher restarted: its cache is empty and its numbering starts again."""
        self.index.clear()
        self.last_seq = None

    def lost(self) -> None:
        """A gap could not be replayed: forget everything (a lost removal would mislead routing)."""
        self.resets += 1
        self.index.clear()

    async def run(self, context: zmq.asyncio.Context) -> None:
        """Subscribe and apply events until cancelled."""
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        try:
            sub.connect(self.endpoint)
        except zmq.ZMQError as exc:  # the approximate tree keeps routing this worker
            logger.warning("cannot subscribe to KV events at %s: %s", self.endpoint, exc)
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
                    logger.info("KV events of %s numbered afresh: the engine restarted", self.endpoint)
                    self.restarted()
                elif self.last_seq is not None and seq > self.last_seq + 1:
                    await self._fill_gap(context, self.last_seq + 1, seq)
                self.receive(seq, frames[2])
        finally:
            sub.close()

    async def _fill_gap(self, context: zmq.asyncio.Context, start: int, until: int) -> None:
        """Replay batches `start` .. `until - 1`; when that fails, reset the index (see `lost`)."""
        recovered = False
        if self.replay_endpoint is not None:
            try:
                recovered = await self._replay(context, self.replay_endpoint, start, until)
            except TimeoutError:
                logger.warning("KV event replay from %d at %s timed out", start, self.replay_endpoint)
        if not recovered:
            logger.warning("KV events %d..%d of %s lost; index reset", start, until - 1, self.endpoint)
            self.lost()
            self.last_seq = until - 1

    async def _replay(self, context: zmq.asyncio.Context, endpoint: str, start: int, until: int) -> bool:
        """True when every batch of the gap came back, in order, and was applied."""
        replay = context.socket(zmq.DEALER)
        replay.setsockopt(zmq.LINGER, 0)
        replay.connect(endpoint)
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
