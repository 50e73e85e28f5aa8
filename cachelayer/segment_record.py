"""One disk-tier record: its byte format, built from parts and verified back (either format).

A record, all little-endian::

    magic b"RGC3" | u32 flags | f64 expires_at (0 = none) | f64 cost | u32 key_len | u64 data_len
    | 16-byte xxh3-128 over (the 36 header bytes before it || key || data) | key | data

``flags`` bit 0 marks a tombstone (a deletion, no data). Records of the first format, magic
``b"RGC2"`` with a 32-byte SHA-256 in the checksum's place, are still read and verified; new ones
are always ``RGC3``. The checksum guards against torn writes and bit flips, not against someone
who can write the directory anyway (no checksum could), and xxh3 hashes ~9 GB/s against SHA-256's
~1 GB/s here: SHA-256 alone cost 3 s of a 64k-token shutdown flush of KV (3 GB).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

import xxhash

from cachelayer.tier import DEFAULT_COST, Entry

__all__ = [
    "HEAD",
    "HEADER_BYTES",
    "LEGACY_MAGIC",
    "MAGIC",
    "MAGIC_PREFIX",
    "MAX_HEADER_BYTES",
    "TOMBSTONE",
    "Buffer",
    "encode_record",
    "entry_parts",
    "header_bytes",
    "parse_record",
    "record_parts",
    "record_size",
    "record_verifies",
]

Buffer = bytes | memoryview
"""A record part: bytes, or a view of the memory the record is written from."""

MAGIC = b"RGC3"
"""The magic of the records written now (xxh3-128 checksum)."""
LEGACY_MAGIC = b"RGC2"
"""The first format's magic (SHA-256 checksum): read, never written."""
MAGIC_PREFIX = b"RGC"
"""What every format's magic starts with (the startup scan searches for it past damage)."""
HEAD = struct.Struct("<4sIddIQ")  # magic, flags, expires_at, cost, key_len, data_len
_DIGEST_BYTES = {MAGIC: 16, LEGACY_MAGIC: 32}
HEADER_BYTES = HEAD.size + _DIGEST_BYTES[MAGIC]
"""Header bytes of a record written now (before its key)."""
MAX_HEADER_BYTES = HEAD.size + max(_DIGEST_BYTES.values())
"""Header bytes of the format with the longest header."""
TOMBSTONE = 1


def record_size(key: bytes, data_len: int) -> int:
    """Bytes a record takes on disk."""
    return HEADER_BYTES + len(key) + data_len


def header_bytes(magic: bytes) -> int | None:
    """Header bytes (before the key) of a record with ``magic``; None when no format has it."""
    digest = _DIGEST_BYTES.get(magic)
    return None if digest is None else HEAD.size + digest


def _digest(magic: bytes, parts: Iterable[Buffer]) -> bytes:
    """The checksum of a record of format ``magic`` over ``parts`` (header, key, data)."""
    hasher = xxhash.xxh3_128() if magic == MAGIC else hashlib.sha256()
    for part in parts:
        hasher.update(part)
    return hasher.digest()


def record_parts(
    key: bytes, data: Sequence[Buffer] | None, *, expires_at: float | None = None, cost: float = DEFAULT_COST
) -> tuple[Buffer, ...]:
    """A record under ``key`` whose data is the buffers of ``data`` joined (None: a tombstone), as
    its parts in order: written with one ``pwritev``, so the data is hashed and written but never
    copied, not even joined."""
    if data is None:
        head = HEAD.pack(MAGIC, TOMBSTONE, 0.0, 0.0, len(key), 0)
        return head, _digest(MAGIC, (head, key)), key
    expires = 0.0 if expires_at is None else expires_at
    head = HEAD.pack(MAGIC, 0, expires, cost, len(key), sum(map(len, data)))
    return head, _digest(MAGIC, (head, key, *data)), key, *data


def encode_record(key: bytes, entry: Entry | None) -> bytes:
    """A record for ``entry`` under ``key`` as one byte string; None encodes a tombstone."""
    return b"".join(entry_parts(key, entry))


def entry_parts(key: bytes, entry: Entry | None) -> tuple[Buffer, ...]:
    """``record_parts`` for a stored ``entry`` (None: a tombstone)."""
    if entry is None:
        return record_parts(key, None)
    return record_parts(key, (entry.data,), expires_at=entry.expires_at, cost=entry.cost)


def record_verifies(blob: bytes) -> bool:
    """Whether ``blob`` is exactly one whole record, of either format, whose checksum holds."""
    if len(blob) < HEAD.size:
        return False
    magic, _, _, _, key_len, data_len = HEAD.unpack_from(blob)
    head_len = header_bytes(magic)
    if head_len is None or len(blob) != head_len + key_len + data_len:
        return False
    body = memoryview(blob)
    return _digest(magic, (body[: HEAD.size], body[head_len:])) == blob[HEAD.size : head_len]


def parse_record(blob: bytes, key: bytes) -> Entry | None:
    """The entry in ``blob`` (one whole record) if it is intact, live data for ``key``; else None."""
    if not record_verifies(blob):
        return None
    magic, flags, expires, cost, key_len, _ = HEAD.unpack_from(blob)
    head_len = header_bytes(magic)
    assert head_len is not None  # it verified
    if flags & TOMBSTONE or blob[head_len : head_len + key_len] != key:
        return None
    return Entry(data=blob[head_len + key_len :], expires_at=None if expires == 0.0 else expires, cost=cost)
