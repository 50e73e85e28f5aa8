"""Disk byte tier (L3): one checksummed file per entry, written atomically, found again after a restart.

Layout under ``directory``: ``<aa>/<sha256(key) hex>.rgc`` (``aa`` = the first two hex digits),
``tmp/`` for writes in progress, and ``.lock``, an exclusive ``flock`` so one process owns the
directory (its in-memory index must be the only writer). A file is::

    magic b"RGC1" | u32 flags (0) | f64 expires_at (0 = none) | f64 cost | u32 key_len | u64 data_len
    | 32-byte SHA-256 over (the 36 header bytes before it || key || data) | key | data

all little-endian. A write goes to ``tmp/``, is flushed and fsync'ed, then renamed over the final
name, so a reader sees the old file, the new file, or none: never half of one. Reads verify length,
key and checksum; anything wrong (truncation, bit flips, a foreign file) is a miss and the file is
removed. The directory itself is not fsync'ed after a rename: a power loss may lose the newest
entries, but never makes one read back wrong.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cachelayer.policies import make_policy
from cachelayer.stats import TierCounters, TierSnapshot
from cachelayer.tier import Entry

__all__ = ["DEFAULT_L3_BYTES", "CacheDirLockedError", "DiskTier", "DiskTierConfig"]

DEFAULT_L3_BYTES = 8 * 1024 * 1024 * 1024

_MAGIC = b"RGC1"
_HEAD = struct.Struct("<4sIddIQ")  # magic, flags, expires_at, cost, key_len, data_len
_HEADER_BYTES = _HEAD.size + 32
_SUFFIX = ".rgc"


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
    """Budget for whole files (header + key + value); never exceeded."""
    policy: str = "lru"
    """Eviction policy: ``lru``, ``lfu``, ``fifo`` or ``adaptive`` (after a restart, by file age)."""
    fsync: bool = True
    """fsync each file before it is renamed into place (off only for throwaway caches)."""


@dataclass(slots=True)
class _Meta:
    size: int
    expires_at: float | None


class DiskTier:
    """Content-addressed files under a byte budget; see the module docstring."""

    def __init__(self, config: DiskTierConfig, clock: Callable[[], float] = time.time) -> None:
        """Open (creating if needed) and index ``config.directory``; raises ``CacheDirLockedError``."""
        if config.capacity_bytes < 0:
            raise ValueError(f"{config.name}.capacity_bytes must be >= 0, got {config.capacity_bytes}")
        self.name = config.name
        self._config = config
        self._clock = clock
        self._root = Path(config.directory)
        self._tmp = self._root / "tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self._root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise CacheDirLockedError(f"cache directory {self._root} is in use by another process") from None
        self._policy = make_policy(config.policy)
        self._index: dict[bytes, _Meta] = {}
        self._bytes = 0
        self._counters = TierCounters()
        self._recover()

    def get(self, key: bytes) -> Entry | None:
        """The verified entry for ``key``, or None."""
        self._counters.queries += 1
        meta = self._index.get(key)
        entry = None
        if meta is not None and meta.expires_at is not None and meta.expires_at <= self._clock():
            self._remove(key)
            self._counters.expirations += 1
        elif meta is not None:
            entry = self._read(key)
            if entry is None:
                self._remove(key)
                self._counters.errors += 1
        if entry is None:
            self._counters.misses += 1
            return None
        self._policy.touch(key)
        self._counters.hits += 1
        return entry

    def contains(self, key: bytes) -> bool:
        """Whether the index holds a live entry for ``key`` (the file is verified only on ``get``)."""
        meta = self._index.get(key)
        return meta is not None and (meta.expires_at is None or meta.expires_at > self._clock())

    def put(self, key: bytes, entry: Entry) -> list[tuple[bytes, Entry]]:
        """Write ``entry`` atomically, evicting by policy first; returns the live entries pushed out."""
        size = _HEADER_BYTES + len(key) + len(entry.data)
        if size > self._config.capacity_bytes:
            self.delete(key)
            return [(key, entry)]
        if key in self._index:
            self._forget(key)
            self._policy.remove(key)
        pushed_out: list[tuple[bytes, Entry]] = []
        now = self._clock()
        while self._bytes + size > self._config.capacity_bytes:
            victim = self._policy.pop_victim()
            assert victim is not None, "policy lost track of stored keys"
            meta = self._index[victim]
            live = meta.expires_at is None or meta.expires_at > now
            evicted = self._read(victim) if live else None
            self._forget(victim)
            self._unlink(self._path(victim))
            if evicted is not None:
                self._counters.evictions += 1
                pushed_out.append((victim, evicted))
            elif live:  # unreadable: counted as an error, nothing to demote
                self._counters.errors += 1
            else:
                self._counters.expirations += 1
        if not self._write(key, entry):
            self._counters.errors += 1
            return [*pushed_out, (key, entry)]
        self._index[key] = _Meta(size, entry.expires_at)
        self._bytes += size
        self._policy.insert(key, size, entry.cost)
        self._counters.puts += 1
        return pushed_out

    def delete(self, key: bytes) -> bool:
        """Drop ``key``; True when it was present."""
        if key not in self._index:
            return False
        self._remove(key)
        return True

    def clear(self) -> None:
        """Remove every entry file."""
        for key in list(self._index):
            self._unlink(self._path(key))
        self._index.clear()
        self._bytes = 0
        self._policy = make_policy(self._config.policy)

    def stats(self) -> TierSnapshot:
        """Counters and size now."""
        return self._counters.snapshot(
            name=self.name,
            kind="disk",
            policy=self._config.policy,
            size=self._bytes,
            entries=len(self._index),
            capacity=self._config.capacity_bytes,
        )

    def close(self) -> None:
        """Release the directory lock (the files stay for the next owner)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _path(self, key: bytes) -> Path:
        name = hashlib.sha256(key).hexdigest()
        return self._root / name[:2] / (name + _SUFFIX)

    def _write(self, key: bytes, entry: Entry) -> bool:
        """Write atomically; False (and nothing left behind) when the disk refuses, e.g. when full."""
        expires = 0.0 if entry.expires_at is None else entry.expires_at
        head = _HEAD.pack(_MAGIC, 0, expires, entry.cost, len(key), len(entry.data))
        digest = hashlib.sha256(head + key + entry.data).digest()
        final = self._path(key)
        tmp = self._tmp / f"{final.stem}.{uuid.uuid4().hex}.tmp"
        try:
            final.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as handle:
                handle.write(head + digest + key)
                handle.write(entry.data)
                handle.flush()
                if self._config.fsync:
                    os.fsync(handle.fileno())
            os.replace(tmp, final)
        except OSError:
            self._unlink(tmp)
            return False
        return True

    def _read(self, key: bytes) -> Entry | None:
        try:
            with open(self._path(key), "rb") as handle:
                blob = handle.read()
        except OSError:
            return None
        parsed = _parse(blob, with_data=True)
        if parsed is None or parsed[0] != key:
            return None
        _, expires_at, cost, data = parsed
        return Entry(data=data, expires_at=expires_at, cost=cost)

    def _recover(self) -> None:
        """Index the files a previous owner left; drop temp files, expired and unreadable entries."""
        for leftover in self._tmp.iterdir():
            self._unlink(leftover)
        found: list[tuple[float, bytes, _Meta, float]] = []
        now = self._clock()
        for path in self._root.glob(f"??/*{_SUFFIX}"):
            scanned = _scan(path)
            if scanned is None or scanned[0] != path.name.removesuffix(_SUFFIX):
                self._unlink(path)
                continue
            _, mtime, key, expires_at, cost, size = scanned
            if expires_at is not None and expires_at <= now:
                self._unlink(path)
                continue
            found.append((mtime, key, _Meta(size, expires_at), cost))
        for _, key, meta, cost in sorted(found, key=lambda item: item[0]):  # oldest first ~ recency
            self._index[key] = meta
            self._bytes += meta.size
            self._policy.insert(key, meta.size, cost)
        while self._bytes > self._config.capacity_bytes:  # the budget may have shrunk since last run
            victim = self._policy.pop_victim()
            assert victim is not None
            self._forget(victim)
            self._unlink(self._path(victim))

    def _remove(self, key: bytes) -> None:
        self._forget(key)
        self._policy.remove(key)
        self._unlink(self._path(key))

    def _forget(self, key: bytes) -> None:
        self._bytes -= self._index.pop(key).size

    @staticmethod
    def _unlink(path: Path) -> None:
        with contextlib.suppress(OSError):  # gone already, or unremovable: either way not ours to read
            path.unlink()


def _scan(path: Path) -> tuple[str, float, bytes, float | None, float, int] | None:
    """(sha256(key) hex, mtime, key, expires_at, cost, file size) from a file's header, or None."""
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            head = handle.read(_HEADER_BYTES)
            if len(head) != _HEADER_BYTES:
                return None
            magic, _, _, _, key_len, data_len = _HEAD.unpack_from(head)
            if magic != _MAGIC or _HEADER_BYTES + key_len + data_len != stat.st_size:
                return None
            parsed = _parse(head + handle.read(key_len), with_data=False)
    except OSError:
        return None
    if parsed is None:
        return None
    key, expires_at, cost, _ = parsed
    return hashlib.sha256(key).hexdigest(), stat.st_mtime, key, expires_at, cost, stat.st_size


def _parse(blob: bytes, *, with_data: bool) -> tuple[bytes, float | None, float, bytes] | None:
    """(key, expires_at, cost, data) from a file's bytes, or None if they are not a valid entry.

    Without ``with_data`` only the header and key are checked (the startup scan); the checksum is
    verified on every read.
    """
    if len(blob) < _HEADER_BYTES:
        return None
    magic, _, expires, cost, key_len, data_len = _HEAD.unpack_from(blob)
    if magic != _MAGIC:
        return None
    key = blob[_HEADER_BYTES : _HEADER_BYTES + key_len]
    if len(key) != key_len:
        return None
    data = b""
    if with_data:
        if len(blob) != _HEADER_BYTES + key_len + data_len:
            return None
        data = blob[_HEADER_BYTES + key_len :]
        if hashlib.sha256(blob[: _HEAD.size] + key + data).digest() != blob[_HEAD.size : _HEADER_BYTES]:
            return None
    return key, (None if expires == 0.0 else expires), cost, data
