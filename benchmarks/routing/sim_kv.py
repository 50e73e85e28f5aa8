"""KV events from the simulated engine: what its prefix cache holds, in vLLM's wire format.

The simulated cache is token-granular (a radix tree of page size 1); events describe whole blocks
of `block_size` tokens, as vLLM's do: a block is announced (BlockStored) once all its tokens are
cached, and withdrawn (BlockRemoved) as soon as eviction takes any of its tokens. A flush sends
AllBlocksCleared. Events go through one queue and one task, so they leave in the order they happened.
A tenant's salt is the first block's extra key, as in vLLM; the simulated cache itself is shared by
all salts (the benchmarks have one tenant), so a sequence's blocks carry the salt it was last stored with.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

from benchmarks.routing.kv_publisher import KvEventPublisher
from cachelayer.radix import EvictedSpan

logger = logging.getLogger("benchmarks.routing.sim_kv")

_Event = tuple[str, tuple[Any, ...]]


def kv_events_config(port: int) -> str:
    """The `kv_events_config` server argument `/server_info` reports, as SGLang's for a wildcard
    bind on `port` (replay one up). The sockets themselves stay on loopback: benchmark traffic
    never leaves 127.0.0.1, and a gateway resolves `*` to the worker's host, 127.0.0.1."""
    return json.dumps(
        {"publisher": "zmq", "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{port + 1}"}
    )


class SimKvEvents:
    """Tracks which whole blocks the simulated cache holds and publishes the changes."""

    def __init__(self, publisher: KvEventPublisher) -> None:
        self.publisher = publisher
        self._held: set[Any] = set()
        self._salts: dict[tuple[int, ...], str] = {}
        """Per first block's tokens, the salt its sequence was last stored with."""
        self._queue: asyncio.Queue[_Event] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def on_loopback(cls, port: int) -> SimKvEvents:
        """Events published on 127.0.0.1:`port` (PUB), replayed one port up (ROUTER), as vLLM does."""
        return cls(KvEventPublisher(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"))

    def start(self) -> None:
        self.publisher.start()
        self._task = asyncio.get_running_loop().create_task(self._drain())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.publisher.close()

    def cached(self, tokens: Sequence[int], salt: str = "") -> None:
        """`tokens` were inserted into the cache: announce its new whole blocks."""
        size = self.publisher.block_size
        if len(tokens) >= size:
            self._salts[tuple(tokens[:size])] = salt
        hashes = self.publisher.block_hashes(tokens, salt)
        first = next((i for i, h in enumerate(hashes) if h not in self._held), len(hashes))
        if first == len(hashes):
            return
        self._held.update(hashes[first:])
        parent = hashes[first - 1] if first else None
        extra = [[salt] if salt and i == 0 else None for i in range(first, len(hashes))]
        blocks = (hashes[first:], parent, tokens[first * size : len(hashes) * size], extra if salt else None)
        self._queue.put_nowait(("stored", blocks))

    def evicted(self, span: EvictedSpan[None]) -> None:
        """`RadixTree(on_evict=...)`: withdraw every whole block that lost a token."""
        size = self.publisher.block_size
        prefix = span.prefix_tokens
        hashes = self.publisher.block_hashes(prefix, self._salts.get(tuple(prefix[:size]), ""))
        lost = [h for h in hashes[span.start // size :] if h in self._held]
        if lost:
            self._held.difference_update(lost)
            self._queue.put_nowait(("removed", (lost,)))

    def cleared(self) -> None:
        self._held.clear()
        self._queue.put_nowait(("cleared", ()))

    async def _drain(self) -> None:
        """Publish queued changes in order (a failure is logged, never silently ends the feed)."""
        while True:
            kind, args = await self._queue.get()
            try:
                if kind == "stored":
                    hashes, parent, tokens, extra = args
                    await self.publisher.store_blocks(hashes, parent, tokens, extra_keys=extra)
                elif kind == "removed":
                    await self.publisher.remove(*args)
                else:
                    await self.publisher.clear()
            except Exception:  # one bad event must not silence the engine's feed
                logger.exception("publishing a KV event failed")
