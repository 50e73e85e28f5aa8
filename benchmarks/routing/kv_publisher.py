"""A simulated engine's KV-event publisher on vLLM's wire format (see `proxy.routing.kv_wire`).

It binds a ZMQ PUB socket and a ROUTER replay socket like vLLM's `ZmqEventPublisher`, numbers every
batch, keeps the last `buffer` batches for replay, and can *drop* a batch (number it and buffer it,
but never send it) to exercise a subscriber's gap handling; a data-parallel engine runs one per
rank. Batches are encoded as vLLM encodes them: msgpack arrays (`array_like`, vLLM <= 0.10 and
SGLang) or maps (current vLLM), with the engine's own block hashes (ints, or 32-byte sha256
digests for the map encoding).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

import msgspec
import zmq
import zmq.asyncio

Encoding = Literal["array", "map"]


class _ArrayStored(msgspec.Struct, array_like=True, omit_defaults=True, tag="BlockStored"):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None


class _ArrayRemoved(msgspec.Struct, array_like=True, omit_defaults=True, tag="BlockRemoved"):
    block_hashes: list[Any]
    medium: str | None


class _ArrayCleared(msgspec.Struct, array_like=True, omit_defaults=True, tag="AllBlocksCleared"):
    pass


class _ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _MapStored(msgspec.Struct, omit_defaults=True, tag="BlockStored"):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None


class _MapRemoved(msgspec.Struct, omit_defaults=True, tag="BlockRemoved"):
    block_hashes: list[Any]
    medium: str | None


class _MapCleared(msgspec.Struct, omit_defaults=True, tag="AllBlocksCleared"):
    pass


class _MapBatch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KvEventPublisher:
    """Publishes BlockStored / BlockRemoved / AllBlocksCleared batches for one simulated engine."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None,
        *,
        topic: str = "",
        block_size: int = 16,
        encoding: Encoding = "array",
        buffer: int = 10_000,
        rank: int = 0,
    ) -> None:
        self.block_size = block_size
        self.encoding = encoding
        self.rank = rank
        """The data-parallel rank whose events these are (a DP engine runs one publisher per rank,
        on the configured ports plus its rank, each numbering its own batches)."""
        self._topic = topic.encode()
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self._replay = None
        if replay_endpoint is not None:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self._seq = 0
        self._encoder = msgspec.msgpack.Encoder()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Serve replay requests in the background."""
        if self._replay is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close()
        if self._replay is not None:
            self._replay.close()
        self._context.term()

    def block_hashes(self, tokens: Sequence[int], salt: str = "") -> list[Any]:
        """The engine's own hashes of the whole blocks of `tokens` (its own scheme, unknown to routers)."""
        hashes: list[Any] = []
        parent = b"engine-seed"
        size = self.block_size
        for i in range(len(tokens) // size):
            extra = salt if (salt and i == 0) else ""
            body = repr((list(tokens[i * size : (i + 1) * size]), extra)).encode()
            parent = hashlib.sha256(parent + body).digest()
            hashes.append(parent if self.encoding == "map" else int.from_bytes(parent[:8], "big") >> 1)
        return hashes

    async def store(
        self, tokens: Sequence[int], *, salt: str = "", medium: str = "GPU", drop: bool = False
    ) -> list[Any]:
        """Publish BlockStored for the whole blocks of `tokens` (one event, parent None); returns
        their hashes. `drop`: numbered and buffered for replay, but never sent."""
        hashes = self.block_hashes(tokens, salt)
        size = self.block_size
        extra = [[salt] if (salt and i == 0) else None for i in range(len(hashes))]
        stored_type = _MapStored if self.encoding == "map" else _ArrayStored
        event = stored_type(
            block_hashes=hashes,
            parent_block_hash=None,
            token_ids=list(tokens[: len(hashes) * size]),
            block_size=size,
            lora_id=None,
            medium=medium,
            lora_name=None,
            extra_keys=extra if salt else None,
        )
        await self._publish([event], drop=drop)
        return hashes

    async def store_blocks(
        self,
        hashes: Sequence[Any],
        parent: Any,
        token_ids: Sequence[int],
        *,
        medium: str = "GPU",
        extra_keys: list[Any] | None = None,
    ) -> None:
        """Publish BlockStored for blocks `hashes` (consecutive, after block `parent`)."""
        stored_type = _MapStored if self.encoding == "map" else _ArrayStored
        event = stored_type(
            block_hashes=list(hashes),
            parent_block_hash=parent,
            token_ids=list(token_ids),
            block_size=self.block_size,
            lora_id=None,
            medium=medium,
            lora_name=None,
            extra_keys=extra_keys,
        )
        await self._publish([event])

    async def remove(self, hashes: Sequence[Any], *, medium: str = "GPU", drop: bool = False) -> None:
        removed_type = _MapRemoved if self.encoding == "map" else _ArrayRemoved
        await self._publish([removed_type(block_hashes=list(hashes), medium=medium)], drop=drop)

    async def clear(self) -> None:
        await self._publish([_MapCleared() if self.encoding == "map" else _ArrayCleared()])

    async def _publish(self, events: list[Any], *, drop: bool = False) -> None:
        batch_type = _MapBatch if self.encoding == "map" else _ArrayBatch
        batch = batch_type(ts=time.time(), events=events, data_parallel_rank=self.rank)
        payload = self._encoder.encode(batch)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        if not drop:
            await self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])

    def forget_buffer(self) -> None:
        """Empty the replay buffer (a gap can then no longer be replayed)."""
        self._buffer.clear()

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await self._replay.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await self._replay.send_multipart([client, b"", END_SEQ, b""])
