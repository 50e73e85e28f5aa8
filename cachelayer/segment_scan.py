"""Reading a segment back at startup: its record headers in order, past any damage.

The disk tier indexes a segment by walking its record headers (``cachelayer.segment_log`` has the
format); record bodies are verified only when read. Where a header is not ours (a flipped bit, a
hole a failed write left, a torn tail), the walk resynchronises: it searches forward for the next
record magic whose whole record verifies (length, checksum) and goes on from there. Every byte
skipped that way is counted in the scan's ``dropped_bytes`` and each stretch in ``gaps``, so one bad
header costs the records it covers, not the rest of its segment. Unreadable bytes with no record
after them are a ``torn_tail`` instead: what a crash mid-write leaves, expected, not damage.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from cachelayer.segment_log import HEAD, HEADER_BYTES, MAGIC, TOMBSTONE

__all__ = ["ScannedRecord", "SegmentScan", "scan_segment"]

MAX_KEY_BYTES = 4096
"""Longest key a plausible header names (ours are 32 bytes); longer ones are damage."""
_SEARCH_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    """A record found by the startup scan (its checksum is verified only when it is read)."""

    key: bytes
    offset: int
    size: int
    tombstone: bool
    expires_at: float | None
    cost: float


@dataclass(slots=True)
class SegmentScan:
    """What one segment holds: its records in write order, and what could not be read."""

    records: list[ScannedRecord] = field(default_factory=list)
    dropped_bytes: int = 0
    """Bytes skipped as damage: between a bad header and the next record that verifies."""
    gaps: int = 0
    """Damaged stretches skipped."""
    torn_tail: int = 0
    """Bytes at the end with no record after them (a write cut short)."""


def scan_segment(path: str) -> SegmentScan:
    """Index the records of the segment at ``path`` (an unreadable file scans as empty)."""
    scan = SegmentScan()
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return scan
    with handle:
        fd = handle.fileno()
        end = os.fstat(fd).st_size
        offset = 0
        while offset < end:
            record = _header_at(fd, offset, end)
            if record is None:
                found = _resync(fd, offset + 1, end)
                if found is None:
                    scan.torn_tail = end - offset
                    break
                scan.gaps += 1
                scan.dropped_bytes += found - offset
                offset = found
                continue
            scan.records.append(record)
            offset += record.size
    return scan


def _header_at(fd: int, offset: int, end: int) -> ScannedRecord | None:
    """The record whose header starts at ``offset``, if the header is plausible and fits the file."""
    if offset + HEADER_BYTES > end:
        return None
    head = os.pread(fd, HEADER_BYTES + MAX_KEY_BYTES, offset)
    magic, flags, expires, cost, key_len, data_len = HEAD.unpack_from(head)
    size = HEADER_BYTES + key_len + data_len
    if magic != MAGIC or key_len > MAX_KEY_BYTES or offset + size > end or flags & ~TOMBSTONE:
        return None
    key = head[HEADER_BYTES : HEADER_BYTES + key_len]
    return ScannedRecord(
        key, offset, size, bool(flags & TOMBSTONE), None if expires == 0.0 else expires, cost
    )


def _resync(fd: int, start: int, end: int) -> int | None:
    """Offset of the first record at or after ``start`` that verifies whole, or None."""
    position = start
    while position < end:
        chunk = os.pread(fd, _SEARCH_CHUNK + len(MAGIC) - 1, position)
        at = chunk.find(MAGIC)
        while at >= 0:
            candidate = position + at
            if _verifies(fd, candidate, end):
                return candidate
            at = chunk.find(MAGIC, at + 1)
        position += _SEARCH_CHUNK
    return None


def _verifies(fd: int, offset: int, end: int) -> bool:
    """Whether a whole, checksummed record starts at ``offset`` (a magic inside data is not one)."""
    record = _header_at(fd, offset, end)
    if record is None:
        return False
    blob = os.pread(fd, record.size, offset)
    digest = hashlib.sha256(blob[: HEAD.size])
    digest.update(blob[HEADER_BYTES:])
    return digest.digest() == blob[HEAD.size : HEADER_BYTES]
