"""The disk tier's shutdown path and its record formats: a record written at once from the caller's
buffers (`put_now`, the KV flush) reads back like any other, after the queued writes, after a
restart and after a SIGKILL mid-flush; a segment of the first format (SHA-256) still reads."""

from __future__ import annotations

import hashlib
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from cachelayer.disk import DiskTier, DiskTierConfig
from cachelayer.segment_log import segment_path
from cachelayer.segment_record import HEAD, LEGACY_MAGIC
from cachelayer.tier import Entry
from tests.cachelayer.test_disk import is_intact, payload, run_python, tier


def queued_tier(path: Path) -> DiskTier:
    return DiskTier(DiskTierConfig(directory=path, capacity_bytes=1 << 30, write_behind=True))


def views(data: bytes, parts: int) -> list[memoryview]:
    """``data`` as ``parts`` views of one numpy buffer, the way a KV page's layers are handed over."""
    buffer = np.frombuffer(bytearray(data), dtype=np.uint8)
    return [memoryview(chunk) for chunk in np.array_split(buffer, parts)]


def test_a_record_written_from_buffers_reads_back_after_the_queued_ones_and_a_restart(
    tmp_path: Path,
) -> None:
    disk = queued_tier(tmp_path)
    queued = [b"queued%d" % i for i in range(20)]
    for key in queued:
        disk.put(key, Entry(payload(key, 1, 50_000), None))
    deadline = time.monotonic() + 30
    disk.finish_by(deadline)
    data = payload(b"now", 1, 70_001)
    assert disk.put_now(b"now", [b"", *views(data, 7)], cost=16.0, deadline=deadline)
    assert disk.get(b"now") == Entry(data, None, 16.0)
    disk.close(deadline)
    reopened = tier(tmp_path)
    assert reopened.get(b"now") == Entry(data, None, 16.0)
    for key in queued:  # written before it: no hole, nothing dropped
        got = reopened.get(key)
        assert got is not None and is_intact(key, got.data)
    assert reopened.stats().errors == 0


def test_a_record_past_its_deadline_is_not_stored(tmp_path: Path) -> None:
    disk = queued_tier(tmp_path)
    assert not disk.put_now(b"late", views(payload(b"late", 1, 1000), 2), cost=1.0, deadline=0.0)
    assert not disk.contains(b"late") and disk.stats().entries == 0
    disk.close()
    reopened = tier(tmp_path)
    assert reopened.get(b"late") is None and reopened.stats().errors == 0


def legacy_record(key: bytes, data: bytes) -> bytes:
    """A record of the first format, built from its documented layout (SHA-256 checksum)."""
    head = HEAD.pack(LEGACY_MAGIC, 0, 0.0, 2.0, len(key), len(data))
    return head + hashlib.sha256(head + key + data).digest() + key + data


def test_a_segment_of_the_first_format_still_reads_and_verifies(tmp_path: Path) -> None:
    (tmp_path / "seg").mkdir()
    damaged = bytearray(legacy_record(b"flipped", payload(b"flipped", 1, 3000)))
    damaged[-10] ^= 0x01
    records = [legacy_record(b"old", payload(b"old", 1, 3000)), bytes(damaged)]
    Path(segment_path(tmp_path / "seg", 1)).write_bytes(b"".join(records))
    disk = tier(tmp_path)
    assert disk.get(b"old") == Entry(payload(b"old", 1, 3000), None, 2.0)
    assert disk.get(b"flipped") is None and disk.stats().errors == 1
    disk.put(b"new", Entry(b"written now", None))  # new records: the current format, beside the old
    disk.close()
    reopened = tier(tmp_path)
    assert reopened.get(b"old") is not None and reopened.get(b"new") == Entry(b"written now", None)


@pytest.mark.parametrize("delay_s", [0.2, 0.5])
def test_sigkill_mid_flush_never_leaves_a_wrong_entry(tmp_path: Path, delay_s: float) -> None:
    writer = run_python(f"""
        import time
        from pathlib import Path
        from cachelayer.disk import DiskTier, DiskTierConfig
        from tests.cachelayer.test_disk import payload
        from tests.cachelayer.test_disk_put_now import views
        disk = DiskTier(DiskTierConfig(directory=Path({str(tmp_path)!r}), write_behind=True))
        disk.finish_by(time.monotonic() + 3600)
        version = 0
        while True:
            version += 1
            for i in range(40):
                key = b"key%d" % i
                data = payload(key, version, 100_000 + (version * 7919 + i * 104729) % 100_000)
                disk.put_now(key, views(data, 30), cost=16.0, deadline=time.monotonic() + 60)
    """)
    deadline = time.monotonic() + 30
    while not any(tmp_path.glob("seg/*.rgs")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay_s)
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(timeout=30) == -signal.SIGKILL
    disk = tier(tmp_path)
    found = 0
    for i in range(40):
        got = disk.get(b"key%d" % i)
        if got is not None:
            found += 1
            assert is_intact(b"key%d" % i, got.data)
    assert found > 0


def test_a_record_after_a_queued_deletion_waits_only_for_it(tmp_path: Path) -> None:
    disk = queued_tier(tmp_path)
    disk.put(b"gone", Entry(b"x" * 100, None))
    disk.close()
    disk = queued_tier(tmp_path)
    assert disk.delete(b"gone")  # a tombstone queued alone
    started = time.monotonic()
    assert disk.put_now(b"now", [b"data"], cost=1.0, deadline=started + 10)
    assert time.monotonic() - started < 5
    disk.close()
    reopened = tier(tmp_path)
    assert reopened.get(b"gone") is None and reopened.get(b"now") == Entry(b"data", None, 1.0)
