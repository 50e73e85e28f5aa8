"""Disk byte tier (L3): checksummed records in append-only segment files, found again after a restart.

Layout under ``directory``: ``seg/<seq>.rgs`` segments (``cachelayer.segment_log``; the records in
them: ``cachelayer.segment_record``) and ``.lock``, an exclusive ``flock`` so one process owns the
directory (its in-memory index must be the only writer).

- ``put`` appends a record to the active segment; a new segment starts when the active one would
  pass ``capacity_bytes / 16`` (at most 64 MiB). ``delete`` appends a tombstone, so the entry stays
  deleted after a restart. Overwritten, evicted and deleted records are dead bytes.
- The budget counts whole segment files. The eviction policy picks victims until the live bytes
  leave room; then the oldest segments are removed until the files do, and whatever is still live
  in a removed segment is evicted with it (under LRU and FIFO those are the least recently
  written). Files never exceed the budget.
- Reads ``pread`` one record and verify its length, key and checksum; anything wrong (truncation,
  bit flips, a torn write) is a miss and the entry is forgotten. A restart scans record headers in
  write order (later records win; tombstones delete) and starts a new segment, so a torn tail is
  never appended to. A damaged header is skipped up to the next record that verifies
  (``cachelayer.segment_scan``), and a file in ``seg/`` that is not named like a segment is left
  alone; both are logged as warnings, and each damaged stretch counts as one error.

With ``write_behind`` records are written by one writer thread: the caller (a request on an event
loop) pays a queue append, and until a record lands its entry is served from the queue. A write
the queue cannot take (more than ``max_pending_bytes`` waiting) is not stored, like any cache
refusal; one the disk refuses is noticed at the next call and forgotten. ``close`` drains the
queue, so a clean shutdown loses nothing; a crash loses at most the queued writes. ``fsync`` syncs
the data once per batch the writer drains (per record without ``write_behind``); the directory is
not synced, so a power loss may lose the newest entries but never makes one read back wrong. A
shutdown bounded by a deadline (``finish_by``, ``close(deadline)``) writes what it can by then
without syncing: the records are in the kernel's page cache, which outlives the process (a restart
finds them), and reach the device at the kernel's writeback; what misses the deadline is dropped.
``put_now`` is that shutdown's bulk path: the caller's thread writes a record from its buffers.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cachelayer.policies import make_policy
from cachelayer.segment_log import SegmentWriter, segment_path
from cachelayer.segment_record import Buffer, parse_record, record_size
from cachelayer.segment_scan import scan_segment, segment_files
from cachelayer.stats import TierCounters, TierSnapshot
from cachelayer.tier import Entry

__all__ = ["DEFAULT_L3_BYTES", "CacheDirLockedError", "DiskTier", "DiskTierConfig"]

DEFAULT_L3_BYTES = 8 * 1024 * 1024 * 1024
DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
MAX_SEGMENT_BYTES = 64 * 1024 * 1024
SEGMENTS_PER_BUDGET = 16
_SEGMENTS = "seg"

logger = logging.getLogger(__name__)


class CacheDirLockedError(RuntimeError):
    """Another process (or another tier in this one) already owns the cache directory."""


@dataclass(frozen=True, slots=True)
class DiskTierConfig:
    """The disk tier."""

    directory: Path
    """Where entries live; created if missing; owned by one process at a time."""
    name: str = "l3"
    """Name in stats and metrics."""
    capacity_bytes: int = DEFAULT_L3_BYTES
    """Budget for the segment files; never exceeded."""
    policy: str = "lru"
    """Eviction policy: ``lru``, ``lfu``, ``fifo`` or ``adaptive`` (after a restart, by write order)."""
    fsync: bool = True
    """fsync written data (see the module docstring; off only for throwaway caches)."""
    write_behind: bool = False
    """Write records on a writer thread (see the module docstring) instead of inside ``put``."""
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    """With ``write_behind``: bytes queued for the writer beyond which a ``put`` is refused."""


@dataclass(slots=True)
class _Meta:
    seq: int
    offset: int
    size: int
    expires_at: float | None


@dataclass(slots=True)
class _Segment:
    size: int = 0
    keys: set[bytes] = field(default_factory=set)
    """Keys whose live record is in this segment."""


class DiskTier:
    """Segmented, checksummed entries under a byte budget; see the module docstring."""

    def __init__(self, config: DiskTierConfig, clock: Callable[[], float] = time.time) -> None:
        """Open (creating if needed) and index ``config.directory``; raises ``CacheDirLockedError``."""
        if config.capacity_bytes < 0:
            raise ValueError(f"{config.name}.capacity_bytes must be >= 0, got {config.capacity_bytes}")
        self.name = config.name
        self._config = config
        self._clock = clock
        self._root = Path(config.directory)
        self._folder = self._root / _SEGMENTS
        self._folder.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self._root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise CacheDirLockedError(f"cache directory {self._root} is in use by another process") from None
        self._segment_limit = min(MAX_SEGMENT_BYTES, max(1, config.capacity_bytes // SEGMENTS_PER_BUDGET))
        self._policy = make_policy(config.policy)
        self._index: dict[bytes, _Meta] = {}
        self._segments: dict[int, _Segment] = {}
        self._read_fds: dict[int, int] = {}
        self._live_bytes = 0
        self._file_bytes = 0
        self._counters = TierCounters()
        self._active = 0
        self._writer = SegmentWriter(
            self._folder,
            background=config.write_behind,
            fsync=config.fsync,
            max_pending_bytes=config.max_pending_bytes,
        )
        self.demotes = True
        """Whether ``put`` reads back and returns what it evicts (False when nothing lies below)."""
        self._recover()

    @property
    def writes_behind(self) -> bool:
        """Whether records are written by the writer thread rather than inside ``put``."""
        return self._config.write_behind

    def get(self, key: bytes) -> Entry | None:
        """The verified entry for ``key``, or None."""
        self._counters.queries += 1
        self._forget_failed_writes()
        meta = self._index.get(key)
        entry = None
        if meta is not None and meta.expires_at is not None and meta.expires_at <= self._clock():
            self._forget(key)
            self._counters.expirations += 1
        elif meta is not None:
            entry = self._read(key, meta)
            if entry is None:
                self._forget(key)
                self._counters.errors += 1
        if entry is None:
            self._counters.misses += 1
            return None
        self._policy.touch(key)
        self._counters.hits += 1
        return entry

    def contains(self, key: bytes) -> bool:
        """Whether the index holds a live entry for ``key`` (the record is verified only on ``get``)."""
        meta = self._index.get(key)
        return meta is not None and (meta.expires_at is None or meta.expires_at > self._clock())

    def put(self, key: bytes, entry: Entry) -> list[tuple[bytes, Entry]]:
        """Append ``entry``, evicting first; returns the live entries pushed out (when ``demotes``)."""
        self._forget_failed_writes()
        size = record_size(key, len(entry.data))
        if size > self._config.capacity_bytes:
            self.delete(key)
            return [(key, entry)]
        pushed_out, (seq, offset) = self._reserve(key, size)
        if not self._writer.append(seq, offset, key, entry):
            self._unreserve(seq, size)
            return [*pushed_out, (key, entry)]
        self._index_new(key, _Meta(seq, offset, size, entry.expires_at), entry.cost)
        self._counters.puts += 1
        return pushed_out

    def put_now(self, key: bytes, data: Sequence[Buffer], *, cost: float, deadline: float) -> bool:
        """Store ``data``'s buffers joined under ``key`` (no TTL), written from them (no copy) by this
        thread after the queued writes: a shutdown flush, after ``finish_by`` (unsynced). False when
        refused: too large, ``deadline`` (``time.monotonic()``) passed, a disk error. Evictions drop."""
        self._forget_failed_writes()
        size = record_size(key, sum(map(len, data)))
        if size > self._config.capacity_bytes:
            self.delete(key)
            return False
        _, (seq, offset) = self._reserve(key, size)
        if not self._writer.write_now(seq, offset, key, data, cost, deadline):
            self._unreserve(seq, size)
            return False
        self._index_new(key, _Meta(seq, offset, size, None), cost)
        self._counters.puts += 1
        return True

    def delete(self, key: bytes) -> bool:
        """Drop ``key`` (a tombstone keeps it dropped after a restart); True when it was present."""
        if key not in self._index:
            return False
        self._forget(key)
        size = record_size(key, 0)
        self._make_room(size)
        seq, offset = self._place(size)
        self._writer.append(seq, offset, key, None)
        return True

    def clear(self) -> None:
        """Remove every segment file."""
        for seq in list(self._segments):
            self._drop_segment(seq)
        self._index.clear()
        self._live_bytes = 0
        self._policy = make_policy(self._config.policy)
        self._roll()

    def stats(self) -> TierSnapshot:
        """Counters and size now (``bytes``: the segment files, dead records included)."""
        return self._counters.snapshot(
            name=self.name,
            kind="disk",
            policy=self._config.policy,
            size=self._file_bytes,
            entries=len(self._index),
            capacity=self._config.capacity_bytes,
        )

    def has_room(self, nbytes: int) -> bool:
        """Whether a ``put`` of ``nbytes`` of data would be queued now rather than refused."""
        return self._writer.has_room(nbytes)

    def finish_by(self, deadline: float) -> None:
        """Shutdown has begun: queued writes land until ``deadline`` (``time.monotonic()``), unsynced."""
        self._writer.finish_by(deadline)

    def close(self, deadline: float | None = None) -> None:
        """Finish queued writes (those not landed by ``deadline``, a ``time.monotonic()`` value, are
        dropped: the next owner misses them), then release the directory lock; the files stay."""
        abandoned = self._writer.close(deadline)
        if abandoned:
            logger.warning(
                "%s: %d queued records not written before the close deadline", self.name, abandoned
            )
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _reserve(self, key: bytes, size: int) -> tuple[list[tuple[bytes, Entry]], tuple[int, int]]:
        """Room for a record of ``size`` bytes replacing ``key``'s: what was pushed out, and where."""
        if key in self._index:
            self._forget(key)
        return self._make_room(size), self._place(size)

    def _unreserve(self, seq: int, size: int) -> None:
        """Nothing was written at the last place reserved: its bytes stay free."""
        self._file_bytes -= size
        self._segments[seq].size -= size
        self._counters.errors += 1

    def _index_new(self, key: bytes, meta: _Meta, cost: float) -> None:
        self._index[key] = meta
        self._segments[meta.seq].keys.add(key)
        self._live_bytes += meta.size
        self._policy.insert(key, meta.size, cost)

    def _make_room(self, size: int) -> list[tuple[bytes, Entry]]:
        """Evict by policy until the live bytes leave room, then drop the oldest segments until the
        files do; returns what was evicted (read back only when ``demotes``)."""
        pushed_out: list[tuple[bytes, Entry]] = []
        now = self._clock()
        capacity = self._config.capacity_bytes
        while self._live_bytes + size > capacity:
            victim = self._policy.pop_victim()
            assert victim is not None, "policy lost track of stored keys"
            self._evict(victim, now, pushed_out)
        while self._file_bytes + size > capacity:
            oldest = min(self._segments)
            for victim in list(self._segments[oldest].keys):
                self._policy.remove(victim)
                self._evict(victim, now, pushed_out)
            self._drop_segment(oldest)
            if oldest == self._active:
                self._roll()
        return pushed_out

    def _evict(self, key: bytes, now: float, pushed_out: list[tuple[bytes, Entry]]) -> None:
        meta = self._index[key]
        live = meta.expires_at is None or meta.expires_at > now
        evicted = self._read(key, meta) if live and self.demotes else None
        self._unindex(key)
        if evicted is not None:
            pushed_out.append((key, evicted))
        if live:
            self._counters.evictions += 1
        else:
            self._counters.expirations += 1

    def _place(self, size: int) -> tuple[int, int]:
        """(segment, offset) for the next record of ``size`` bytes, rolling to a new segment if due."""
        active = self._segments[self._active]
        if active.size and active.size + size > self._segment_limit:
            self._roll()
            active = self._segments[self._active]
        offset = active.size
        active.size += size
        self._file_bytes += size
        return self._active, offset

    def _roll(self) -> None:
        self._active = max(self._segments, default=self._active) + 1
        self._segments[self._active] = _Segment()

    def _drop_segment(self, seq: int) -> None:
        segment = self._segments.pop(seq)
        self._file_bytes -= segment.size
        fd = self._read_fds.pop(seq, None)
        if fd is not None:
            os.close(fd)
        self._writer.drop(seq)

    def _read(self, key: bytes, meta: _Meta) -> Entry | None:
        queued = self._writer.pending(key, meta.seq, meta.offset)
        if queued is not None:
            return queued
        try:
            fd = self._read_fds.get(meta.seq)
            if fd is None:
                fd = os.open(segment_path(self._folder, meta.seq), os.O_RDONLY)
                self._read_fds[meta.seq] = fd
            blob = os.pread(fd, meta.size, meta.offset)
        except OSError:
            return None
        return parse_record(blob, key)

    def _forget(self, key: bytes) -> None:
        """Drop ``key`` from the index and the policy (its record becomes dead bytes)."""
        self._unindex(key)
        self._policy.remove(key)

    def _unindex(self, key: bytes) -> None:
        meta = self._index.pop(key)
        self._live_bytes -= meta.size
        segment = self._segments.get(meta.seq)
        if segment is not None:
            segment.keys.discard(key)

    def _forget_failed_writes(self) -> None:
        """Forget entries whose record the disk refused (unless rewritten elsewhere since)."""
        failed = self._writer.failed
        while failed:
            miss = failed.popleft()
            meta = self._index.get(miss.key)
            if meta is not None and (meta.seq, meta.offset) == (miss.seq, miss.offset):
                self._forget(miss.key)
                self._counters.errors += 1

    def _recover(self) -> None:
        """Index the segments a previous owner left (write order; tombstones delete), drop expired
        entries, shrink to the budget, and start a new active segment."""
        for legacy in (*self._root.glob("??/*.rgc"), *self._root.glob("tmp/*.tmp")):  # the old layout
            with contextlib.suppress(OSError):
                legacy.unlink()
                legacy.parent.rmdir()
        seqs = segment_files(self._folder, self.name)
        now = self._clock()
        for seq in seqs:
            path = segment_path(self._folder, seq)
            segment = self._segments[seq] = _Segment(size=os.stat(path).st_size)
            self._file_bytes += segment.size
            scan = scan_segment(path, self.name)
            self._counters.errors += scan.gaps
            for record in scan.records:
                if record.key in self._index:
                    self._forget(record.key)
                if record.tombstone or (record.expires_at is not None and record.expires_at <= now):
                    continue
                self._index_new(
                    record.key, _Meta(seq, record.offset, record.size, record.expires_at), record.cost
                )
        self._active = seqs[-1] if seqs else 0
        self._roll()
        for seq in seqs:  # the oldest segments holding nothing live are only dead bytes (a newer one
            if self._segments[seq].keys:  # may hold tombstones for records in older ones: it stays)
                break
            self._drop_segment(seq)
        demotes, self.demotes = self.demotes, False
        self._make_room(0)  # the budget may have shrunk since the last run
        self.demotes = demotes
