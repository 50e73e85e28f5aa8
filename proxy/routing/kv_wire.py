"""The KV-cache event wire format of vLLM and SGLang, decoded with msgspec.

An engine started with KV events enabled publishes on a ZMQ PUB socket one multipart message per
batch, `[topic, seq, payload]`: `seq` an 8-byte big-endian sequence number, `payload` a msgpack
`EventBatch` `{ts, events, data_parallel_rank}` whose events are tagged structs:

    BlockStored      block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
                     lora_name, extra_keys (one tuple per block: cache salt, LoRA, media hashes)
    BlockRemoved     block_hashes, medium
    AllBlocksCleared

Older vLLM releases and SGLang encode every struct as a msgpack array (fields in order, the tag
first); current vLLM encodes maps (the tag under "type"). Both are decoded. Block hashes are ints
(older) or bytes (current). A ROUTER socket, when configured, replays missed batches: send
`["", start_seq]`, receive `["", seq, payload]` per buffered batch from `start_seq` on, then
`["", -1, ""]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

BlockHash = int | bytes
END_OF_REPLAY = -1
SEQ_BYTES = 8


class _ArrayStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[list[Any] | None] | None = None


class _ArrayRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[BlockHash]
    medium: str | None = None


class _ArrayCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class _ArrayBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_ArrayStored | _ArrayRemoved | _ArrayCleared]
    data_parallel_rank: int | None = None


class _MapStored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[list[Any] | None] | None = None


class _MapRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[BlockHash]
    medium: str | None = None


class _MapCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class _MapBatch(msgspec.Struct):
    ts: float
    events: list[_MapStored | _MapRemoved | _MapCleared]
    data_parallel_rank: int | None = None


_array_batch = msgspec.msgpack.Decoder(_ArrayBatch)
_map_batch = msgspec.msgpack.Decoder(_MapBatch)

DEFAULT_MEDIUM = "GPU"


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Blocks the engine now holds: consecutive blocks of `block_size` tokens of `token_ids`,
    the first one's parent `parent` (None: the first block of a sequence)."""

    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str
    extra_keys: tuple[tuple[Any, ...] | None, ...]
    """One entry per block (empty when the engine sent none)."""


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    hashes: tuple[BlockHash, ...]
    medium: str


@dataclass(frozen=True, slots=True)
class AllCleared:
    pass


KvEvent = BlocksStored | BlocksRemoved | AllCleared


class WireError(ValueError):
    """A payload that is not an EventBatch in either encoding."""


def decode_batch(payload: bytes) -> list[KvEvent]:
    """The events of one msgpack `EventBatch` (array or map encoding)."""
    if not payload:
        raise WireError("empty payload")
    first = payload[0]
    try:
        if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):
            batch: _ArrayBatch | _MapBatch = _array_batch.decode(payload)
        else:
            batch = _map_batch.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(str(exc)) from exc
    return [_event(raw) for raw in batch.events]


def _event(raw: object) -> KvEvent:
    if isinstance(raw, _ArrayStored | _MapStored):
        extra = tuple(None if keys is None else tuple(keys) for keys in raw.extra_keys or ())
        return BlocksStored(
            hashes=tuple(raw.block_hashes),
            parent=raw.parent_block_hash,
            token_ids=tuple(raw.token_ids),
            block_size=raw.block_size,
            medium=raw.medium or DEFAULT_MEDIUM,
            extra_keys=extra,
        )
    if isinstance(raw, _ArrayRemoved | _MapRemoved):
        return BlocksRemoved(hashes=tuple(raw.block_hashes), medium=raw.medium or DEFAULT_MEDIUM)
    return AllCleared()


def encode_seq(seq: int) -> bytes:
    """A sequence number as it travels: 8 bytes, big-endian, signed (the replay's end is -1)."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def decode_seq(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)
