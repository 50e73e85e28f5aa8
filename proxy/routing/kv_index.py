"""One worker's exact index of the KV blocks its engine holds, built from its KV events.

The engine's own block hashes depend on its hash function and seed, which a router need not know;
the events carry each block's tokens and its parent, so the index keys each block by its own chain
hash instead, computed the same way for a request's prompt:

    key_0 = H(ROOT, extra_0, tokens[0:B]),   key_i = H(key_{i-1}, extra_i, tokens[i*B:(i+1)*B])

with B the engine's block size and extra_i the block's extra keys (the tenant's cache salt on the
first block, as vLLM puts it; so two tenants' identical prompts never share a key). A prompt's
cached prefix is then the run of its leading keys present, in blocks, in any medium (GPU, CPU,
disk: each medium's blocks are indexed apart, and a block counts while one medium holds it).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.routing.kv_wire import AllCleared, BlockHash, BlocksRemoved, BlocksStored, KvEvent

ROOT_KEY = b"radixgate-kv-root"


def chain_key(parent: bytes, extra: tuple[Any, ...] | None, tokens: Sequence[int]) -> bytes:
    """The index key of one block given its parent's key, its extra keys and its tokens."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(repr(extra).encode() if extra else b"-")
    digest.update(tokens.tobytes() if isinstance(tokens, array) else array("I", tokens).tobytes())
    return digest.digest()


def chain_keys(tokens: Sequence[int], salt: str, block_size: int) -> list[bytes]:
    """The keys of every whole block of a prompt (computed once per decision, shared by workers)."""
    keys: list[bytes] = []
    parent, extra = ROOT_KEY, salt_extra(salt)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = chain_key(parent, extra, tokens[start : start + block_size])
        keys.append(parent)
        extra = None
    return keys


def salt_extra(salt: str) -> tuple[Any, ...] | None:
    """The first block's extra keys for a request of tenant salt `salt` (None: no salt)."""
    return (salt,) if salt else None


@dataclass(slots=True)
class KvBlockIndex:
    """Blocks by engine hash (for removals and parents) and by chain key (for matching), per medium."""

    block_size: int = 0
    """Tokens per block, from the events (0 until the first BlockStored)."""
    _key_of: dict[BlockHash, bytes] = field(default_factory=dict)
    _media: dict[bytes, set[str]] = field(default_factory=dict)
    events: int = 0
    orphans: int = 0
    """Stored blocks whose parent the index never saw (events lost before a resync): skipped."""

    @property
    def blocks(self) -> int:
        """Distinct blocks held, in any medium."""
        return len(self._media)

    def blocks_by_medium(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for media in self._media.values():
            for medium in media:
                counts[medium] = counts.get(medium, 0) + 1
        return counts

    def apply(self, event: KvEvent) -> None:
        """Fold one event into the index."""
        self.events += 1
        if isinstance(event, BlocksStored):
            self._stored(event)
        elif isinstance(event, BlocksRemoved):
            for block_hash in event.hashes:
                key = self._key_of.get(block_hash)
                media = self._media.get(key) if key is not None else None
                if key is None or media is None:
                    continue
                media.discard(event.medium)
                if not media:
                    del self._media[key]
                    del self._key_of[block_hash]
        elif isinstance(event, AllCleared):
            self.clear()

    def clear(self) -> None:
        self._key_of.clear()
        self._media.clear()

    def match(self, tokens: Sequence[int], salt: str = "") -> int:
        """Leading tokens of `tokens` held in whole blocks (any medium)."""
        return self.match_keys(chain_keys(tokens, salt, self.block_size)) if self.block_size > 0 else 0

    def match_keys(self, keys: Sequence[bytes]) -> int:
        """Leading tokens held, given a prompt's `chain_keys` at this index's block size."""
        held = 0
        for key in keys:
            if key not in self._media:
                break
            held += 1
        return held * self.block_size

    def _stored(self, event: BlocksStored) -> None:
        size = event.block_size
        self.block_size = size
        parent = ROOT_KEY if event.parent is None else self._key_of.get(event.parent)
        if parent is None:
            self.orphans += len(event.hashes)
            return
        for i, block_hash in enumerate(event.hashes):
            tokens = event.token_ids[i * size : (i + 1) * size]
            extra = event.extra_keys[i] if i < len(event.extra_keys) else None
            parent = chain_key(parent, extra, tokens)
            self._key_of[block_hash] = parent
            self._media.setdefault(parent, set()).add(event.medium)
