"""The disk tier's files: append-only segments of checksummed records, and the thread that writes them.

A segment is ``seg/<seq:010d>.rgs``, a run of records back to back (the record format is
``cachelayer.segment_record``). One file per entry cost ~0.4 ms of kernel time per write here
(create, write, rename on ext4), an append costs one ``pwritev``: that is why entries share files.

Every write goes to an offset the tier chose when it accepted the entry, so writes may be queued
(``SegmentWriter``) and the tier can answer for a queued entry from memory until it lands. A torn
record (a crash mid-write) fails its checksum or runs past the end of the file: a miss, never a
wrong answer. Reading a segment back at startup is ``cachelayer.segment_scan``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cachelayer.segment_record import Buffer, entry_parts, record_parts
from cachelayer.tier import Entry

__all__ = ["SUFFIX", "SegmentWriter", "WriteFailed", "segment_path"]

SUFFIX = ".rgs"
BATCH_WAIT_S = 0.005
"""How long the writer lets records gather after the first one (CPU per record falls ~2x here)."""


def segment_path(folder: Path, seq: int) -> str:
    """The file of segment ``seq`` under ``folder``."""
    return f"{folder}/{seq:010d}{SUFFIX}"


@dataclass(slots=True, eq=False)
class _Write:
    seq: int
    offset: int
    key: bytes
    entry: Entry | None
    """None: a tombstone."""


@dataclass(slots=True, eq=False)
class _Drop:
    seq: int


@dataclass(frozen=True, slots=True)
class WriteFailed:
    """A record the disk refused: the tier forgets the entry if it still points there."""

    key: bytes
    seq: int
    offset: int


class SegmentWriter:
    """Applies appends and segment removals in order, inline or on one daemon thread.

    Queued (``background``): ``pending`` answers for an entry until its record has landed, and
    with ``fsync`` the thread syncs once per batch it drains (group commit), not per record.
    """

    def __init__(self, folder: Path, *, background: bool, fsync: bool, max_pending_bytes: int) -> None:
        self._folder = folder
        self._fsync = fsync
        self._max_pending_bytes = max_pending_bytes
        self._fds: dict[int, int] = {}
        self._pending: dict[bytes, _Write] = {}
        self._queue: deque[_Write | _Drop] = deque()
        self._queued_bytes = 0
        self._closed = False
        self._deadline: float | None = None
        self._abandoned = 0
        self._idle = False
        self._wake = threading.Condition()
        self._io = threading.Lock()  # held while records are written: the writer's batch, `write_now`
        self.failed: deque[WriteFailed] = deque()
        """Records the disk refused (appended by the writer, drained by the tier)."""
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="radixgate-l3-writer", daemon=True)
            self._thread.start()

    def append(self, seq: int, offset: int, key: bytes, entry: Entry | None) -> bool:
        """Write a record at ``offset`` of segment ``seq``; False when the queue is over its budget."""
        op = _Write(seq, offset, key, entry)
        if self._thread is None:
            self._apply([op])
            return True
        size = 0 if entry is None else len(entry.data)
        with self._wake:
            if self._closed or self._queued_bytes + size > self._max_pending_bytes:
                return False
            self._queued_bytes += size
            if entry is not None:
                self._pending[key] = op
            else:
                self._pending.pop(key, None)
            self._queue.append(op)
            if self._idle:
                self._wake.notify()
        return True

    def write_now(
        self, seq: int, offset: int, key: bytes, data: Sequence[Buffer], cost: float, deadline: float
    ) -> bool:
        """Write a record of ``data`` (buffers, never joined) at ``offset`` of segment ``seq`` from
        this thread, once every write queued before has landed (no hole before it), unsynced: for
        a shutdown's flush. False when ``time.monotonic()`` reached ``deadline`` first (nothing
        written), the writer is closed, or the disk refused it."""
        with self._wake:
            while self._queue and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
            if self._closed:
                return False
        if not self._io.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False  # the writer's last batch (taken with `_io` held) is still landing
        try:
            if time.monotonic() >= deadline:
                return False
            _write_all(self._fd(seq), record_parts(key, data, cost=cost), offset)
            return True
        except OSError:
            return False
        finally:
            self._io.release()

    def drop(self, seq: int) -> None:
        """Remove segment ``seq``'s file (after every write queued before this call)."""
        if self._thread is None:
            self._apply([_Drop(seq)])
            return
        with self._wake:
            self._queue.append(_Drop(seq))
            if self._idle:
                self._wake.notify()

    def pending(self, key: bytes, seq: int, offset: int) -> Entry | None:
        """The queued entry for ``key`` at that place, if its record has not landed yet."""
        if self._thread is None:
            return None
        with self._wake:
            op = self._pending.get(key)
        return op.entry if op is not None and op.seq == seq and op.offset == offset else None

    def has_room(self, nbytes: int) -> bool:
        """Whether a write of ``nbytes`` would be queued now (always, without a writer thread)."""
        if self._thread is None:
            return True
        with self._wake:
            return not self._closed and self._queued_bytes + nbytes <= self._max_pending_bytes

    def finish_by(self, deadline: float) -> None:
        """Shutdown has begun: write what is queued (and what comes) until ``time.monotonic()``
        reaches ``deadline``, drop the rest, and stop syncing: the records reach the kernel's page
        cache, which outlives this process; the device gets them at the kernel's writeback."""
        with self._wake:
            self._deadline = deadline

    def close(self, deadline: float | None = None) -> int:
        """Apply everything queued, stop the thread and close the files; returns the records left
        unwritten. With a ``deadline`` (a ``time.monotonic()`` value) this is ``finish_by`` first.

        Records are written in offset order, so the ones left out are each segment's tail: no hole."""
        if self._thread is not None:
            with self._wake:
                self._closed = True
                if deadline is not None:
                    self._deadline = deadline
                self._wake.notify_all()
            self._thread.join()
        self._close_all()
        return self._abandoned

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._idle = True
                    self._wake.wait()
                self._idle = False
                if not self._queue:
                    return
                gather = not self._closed
            if gather:  # let a batch gather: one wake-up and one sync for many records
                time.sleep(BATCH_WAIT_S)
            with self._wake:
                batch = list(self._queue)
                self._queue.clear()
                self._io.acquire()  # taken with the batch: `write_now` waits for what it sees leave
                self._wake.notify_all()
            try:
                self._apply(batch)
            finally:
                self._io.release()

    def _landed(self, op: _Write) -> None:
        """``op``'s record is written (or refused): its bytes leave the queue's budget at once, so a
        ``put`` may be queued while the rest of the batch is written."""
        if self._thread is None or op.entry is None:
            return
        with self._wake:
            self._queued_bytes -= len(op.entry.data)
            if self._pending.get(op.key) is op:
                del self._pending[op.key]
            self._wake.notify_all()

    def _apply(self, batch: list[_Write | _Drop]) -> None:
        touched: set[int] = set()
        for done, op in enumerate(batch):
            deadline = self._deadline
            if deadline is not None and time.monotonic() >= deadline:
                self._abandoned += len(batch) - done
                break
            if isinstance(op, _Drop):
                fd = self._fds.pop(op.seq, None)
                if fd is not None:
                    os.close(fd)
                touched.discard(op.seq)
                with contextlib.suppress(OSError):
                    os.unlink(segment_path(self._folder, op.seq))
                continue
            try:
                _write_all(self._fd(op.seq), entry_parts(op.key, op.entry), op.offset)
                touched.add(op.seq)
            except OSError:
                self.failed.append(WriteFailed(op.key, op.seq, op.offset))
            self._landed(op)
        if self._fsync and self._deadline is None:
            for seq in touched & self._fds.keys():
                with contextlib.suppress(OSError):
                    os.fdatasync(self._fds[seq])

    def _fd(self, seq: int) -> int:
        """The open file of segment ``seq``, created if new."""
        fd = self._fds.get(seq)
        if fd is None:  # a new active segment: older ones are never written again
            self._close_all()
            fd = os.open(segment_path(self._folder, seq), os.O_WRONLY | os.O_CREAT, 0o644)
            self._fds[seq] = fd
        return fd

    def _close_all(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                if self._fsync and self._deadline is None:
                    os.fdatasync(fd)
                os.close(fd)
        self._fds.clear()


def _write_all(fd: int, parts: Sequence[Buffer], offset: int) -> None:
    """Write ``parts`` back to back at ``offset`` with one ``pwritev`` (a short write, rare, is
    finished piecewise)."""
    written = os.pwritev(fd, parts, offset)
    if written == sum(map(len, parts)):
        return
    view = memoryview(b"".join(parts))[written:]
    offset += written
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
