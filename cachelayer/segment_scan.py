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

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from cachelayer.segment_log import SUFFIX, segment_path
from cachelayer.segment_record import (
    HEAD,
    MAGIC_PREFIX,
    MAX_HEADER_BYTES,
    TOMBSTONE,
    header_bytes,
    record_verifies,
)

__all__ = ["ScannedRecord", "SegmentScan", "scan_segment", "segment_files"]

logger = logging.getLogger(__name__)

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


def segment_files(folder: Path, tier: str) -> list[int]:
    """Sequence numbers of the segment files in ``folder``, in order; other files are skipped, with
    a warning naming ``tier``."""
    seqs: list[int] = []
    for path in folder.glob(f"*{SUFFIX}"):
        stem = path.name.removesuffix(SUFFIX)
        if stem.isdigit() and path.is_file() and segment_path(folder, int(stem)) == str(path):
            seqs.append(int(stem))
        else:
            logger.warning("%s: skipping %s, which is not a segment of this cache", tier, path)
    return sorted(seqs)


def scan_segment(path: str, tier: str) -> SegmentScan:
    """Index the records of the segment at ``path`` (an unreadable file scans as empty); damage is
    logged as a warning naming ``tier``, a torn tail as information."""
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
    if scan.gaps:
        logger.warning(
            "%s: segment %s has %d damaged stretches (%d bytes) skipped; the records there are lost",
            tier,
            path,
            scan.gaps,
            scan.dropped_bytes,
        )
    if scan.torn_tail:
        logger.info("%s: segment %s ends in %d bytes of a cut-short write", tier, path, scan.torn_tail)
    return scan


def _header_at(fd: int, offset: int, end: int) -> ScannedRecord | None:
    """The record whose header starts at ``offset``, if the header is plausible and fits the file."""
    head = os.pread(fd, MAX_HEADER_BYTES + MAX_KEY_BYTES, offset)
    if len(head) < HEAD.size:
        return None
    magic, flags, expires, cost, key_len, data_len = HEAD.unpack_from(head)
    head_len = header_bytes(magic)
    if head_len is None or key_len > MAX_KEY_BYTES or flags & ~TOMBSTONE:
        return None
    size = head_len + key_len + data_len
    if offset + size > end:
        return None
    key = head[head_len : head_len + key_len]
    return ScannedRecord(
        key, offset, size, bool(flags & TOMBSTONE), None if expires == 0.0 else expires, cost
    )


def _resync(fd: int, start: int, end: int) -> int | None:
    """Offset of the first record at or after ``start`` that verifies whole, or None."""
    position = start
    while position < end:
        chunk = os.pread(fd, _SEARCH_CHUNK + len(MAGIC_PREFIX) - 1, position)
        at = chunk.find(MAGIC_PREFIX)
        while at >= 0:
            candidate = position + at
            if _verifies(fd, candidate, end):
                return candidate
            at = chunk.find(MAGIC_PREFIX, at + 1)
        position += _SEARCH_CHUNK
    return None


def _verifies(fd: int, offset: int, end: int) -> bool:
    """Whether a whole, checksummed record starts at ``offset`` (a magic inside data is not one)."""
    record = _header_at(fd, offset, end)
    if record is None:
        return False
    return record_verifies(os.pread(fd, record.size, offset))
