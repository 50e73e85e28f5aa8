"""The disk tier: restarts, corruption, SIGKILL mid-write, the directory lock, budgets, and L3 in a store."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cachelayer.disk import CacheDirLockedError, DiskTier, DiskTierConfig
from cachelayer.memory import MemoryTierConfig
from cachelayer.segment_log import segment_path
from cachelayer.segment_record import HEADER_BYTES, MAGIC
from cachelayer.tier import Entry
from cachelayer.tiers import StoreConfig, TieredStore

REPO = Path(__file__).resolve().parents[2]


def payload(key: bytes, version: int, size: int) -> bytes:
    """A value that names its own key and version, so any mix-up is detectable."""
    head = version.to_bytes(4, "little") + size.to_bytes(4, "little")
    body = b"".join(
        hashlib.sha256(key + head + i.to_bytes(4, "little")).digest() for i in range(size // 32 + 1)
    )
    return head + body[:size]


def is_intact(key: bytes, value: bytes) -> bool:
    version, size = int.from_bytes(value[:4], "little"), int.from_bytes(value[4:8], "little")
    return value == payload(key, version, size)


def run_python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO)


def tier(path: Path, capacity: int = 1 << 30) -> DiskTier:
    return DiskTier(DiskTierConfig(directory=path, capacity_bytes=capacity))


def test_entries_survive_a_process_restart(tmp_path: Path) -> None:
    writer = run_python(f"""
        import time
        from pathlib import Path
        from cachelayer.disk import DiskTier, DiskTierConfig
        from cachelayer.tier import Entry
        from tests.cachelayer.test_disk import payload
        disk = DiskTier(DiskTierConfig(directory=Path({str(tmp_path)!r})))
        for i in range(20):
            disk.put(b"key%d" % i, Entry(payload(b"key%d" % i, 1, 1000 * i), None, cost=float(i)))
        disk.put(b"short-lived", Entry(b"x", time.time() + 3600))
        disk.put(b"expired", Entry(b"x", time.time() - 1))
    """)
    assert writer.wait(timeout=60) == 0
    disk = tier(tmp_path)
    assert disk.stats().entries == 21  # the already-expired entry was dropped while indexing
    for i in range(20):
        got = disk.get(b"key%d" % i)
        assert got is not None and got.data == payload(b"key%d" % i, 1, 1000 * i) and got.cost == i
    live = disk.get(b"short-lived")
    assert live is not None and live.expires_at is not None and live.expires_at > time.time()
    assert disk.get(b"expired") is None


def _record_place(disk: DiskTier, key: bytes) -> tuple[Path, int, int]:
    """(segment file, offset, size) of ``key``'s live record."""
    meta = disk._index[key]
    return Path(segment_path(tmp_segments(disk), meta.seq)), meta.offset, meta.size


def tmp_segments(disk: DiskTier) -> Path:
    return disk._folder


def test_corrupt_or_truncated_records_are_misses_and_forgotten(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    for name in (b"flip", b"fine", b"cut"):
        disk.put(name, Entry(payload(name, 1, 5000), None))
    segment, flip_at, flip_size = _record_place(disk, b"flip")
    _, cut_at, _ = _record_place(disk, b"cut")
    raw = bytearray(segment.read_bytes())
    raw[flip_at + flip_size - 100] ^= 0x01
    segment.write_bytes(bytes(raw[: cut_at + 3000]))  # and the last record torn
    assert disk.get(b"flip") is None and disk.get(b"cut") is None
    assert disk.stats().errors == 2 and disk.stats().entries == 1
    assert disk.get(b"flip") is None and disk.stats().errors == 2  # forgotten: not read again
    got = disk.get(b"fine")
    assert got is not None and is_intact(b"fine", got.data)
    disk.close()
    legacy = tmp_path / "ab" / ("ab" + "0" * 62 + ".rgc")  # the old one-file-per-entry layout
    legacy.parent.mkdir()
    legacy.write_bytes(b"an entry in the old format")
    reopened = tier(tmp_path)
    assert not legacy.exists() and not legacy.parent.exists()
    # The torn record ends the scan of its segment; the flipped one is found and fails on read.
    assert reopened.get(b"cut") is None and reopened.get(b"flip") is None
    got = reopened.get(b"fine")
    assert got is not None and is_intact(b"fine", got.data)


@pytest.mark.parametrize("capacity", [1 << 30, 4_000], ids=["one segment", "a record per segment"])
def test_deletes_and_overwrites_hold_after_restarts(tmp_path: Path, capacity: int) -> None:
    disk = tier(tmp_path, capacity)
    disk.put(b"gone", Entry(payload(b"gone", 1, 300), None))
    disk.put(b"other", Entry(payload(b"other", 1, 300), None))
    disk.put(b"kept", Entry(payload(b"kept", 1, 300), None))
    disk.put(b"kept", Entry(payload(b"kept", 2, 400), None))
    assert disk.delete(b"gone") and not disk.delete(b"gone")
    disk.close()
    for _ in range(2):  # the second restart reads what the first one left
        reopened = tier(tmp_path, capacity)
        assert reopened.get(b"gone") is None
        got = reopened.get(b"kept")
        assert got is not None and got.data == payload(b"kept", 2, 400)
        assert reopened.stats().entries == 2
        reopened.close()


@pytest.mark.parametrize("delay_s", [0.3, 0.6, 0.9])
def test_sigkill_mid_writes_never_leaves_a_wrong_entry(tmp_path: Path, delay_s: float) -> None:
    writer = run_python(f"""
        from pathlib import Path
        from cachelayer.disk import DiskTier, DiskTierConfig
        from cachelayer.tier import Entry
        from tests.cachelayer.test_disk import payload
        disk = DiskTier(DiskTierConfig(directory=Path({str(tmp_path)!r}), capacity_bytes=3_000_000))
        version = 0
        while True:
            version += 1
            for i in range(30):
                key = b"key%d" % i
                disk.put(key, Entry(payload(key, version, (version * 7919 + i * 104729) % 200_000), None))
    """)
    deadline = time.monotonic() + 30
    while not any(tmp_path.glob("seg/*.rgs")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay_s)
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(timeout=30) == -signal.SIGKILL
    disk = tier(tmp_path, capacity=3_000_000)  # the kernel released the dead writer's lock
    found = 0
    for i in range(30):
        got = disk.get(b"key%d" % i)
        if got is not None:
            found += 1
            assert is_intact(b"key%d" % i, got.data)
    assert found > 0
    assert disk.stats().errors == 0  # atomic renames: nothing half-written under a final name
    assert (disk.stats().bytes or 0) <= 3_000_000


def test_one_owner_per_directory(tmp_path: Path) -> None:
    first = tier(tmp_path)
    with pytest.raises(CacheDirLockedError, match="in use"):
        tier(tmp_path)
    first.close()
    tier(tmp_path).close()


def test_budget_evicts_files_and_shrinks_on_reopen(tmp_path: Path) -> None:
    disk = tier(tmp_path, capacity=50_000)
    for i in range(10):
        disk.put(b"k%d" % i, Entry(payload(b"k%d" % i, 1, 9_000), None))
    stats = disk.stats()
    assert stats.bytes is not None and stats.bytes <= 50_000 and stats.evictions == 5
    assert len(list(tmp_path.glob("seg/*.rgs"))) == stats.entries == 5  # a 9 KB record per segment
    assert disk.get(b"k0") is None and disk.get(b"k9") is not None
    disk.close()
    smaller = tier(tmp_path, capacity=20_000)
    assert smaller.stats().entries == 2 and len(list(tmp_path.glob("seg/*.rgs"))) == 2
    assert disk.put(b"huge", Entry(b"x" * 100_000, None)) == [(b"huge", Entry(b"x" * 100_000, None))]


def test_store_demotes_to_disk_and_finds_it_after_restart(tmp_path: Path) -> None:
    config = StoreConfig(
        l1=MemoryTierConfig(name="l1", capacity_bytes=3_000),
        l2=MemoryTierConfig(name="l2", capacity_bytes=6_000, compress=True),
        l3=DiskTierConfig(directory=tmp_path, capacity_bytes=1_000_000),
    )
    store = TieredStore.from_config(config)
    for i in range(12):
        store.put(b"k%d" % i, payload(b"k%d" % i, 1, 2_000))
    assert store.stats().tiers[2].entries == 9  # L1 and L2 hold the newest 1 and 2; the rest went down
    store.close()
    store = TieredStore.from_config(config)
    assert store.locate(b"k0") == "l3"
    assert store.get(b"k0") == payload(b"k0", 1, 2_000)
    assert [t.hits for t in store.stats().tiers] == [0, 0, 1]
    assert store.get(b"k0") == payload(b"k0", 1, 2_000)
    assert [t.hits for t in store.stats().tiers] == [1, 0, 1]  # promoted on the first hit
    store.close()


def test_write_behind_serves_queued_entries_and_close_lands_them(tmp_path: Path) -> None:
    disk = DiskTier(DiskTierConfig(directory=tmp_path, capacity_bytes=60_000, write_behind=True))
    for i in range(10):
        disk.put(b"k%d" % i, Entry(payload(b"k%d" % i, 1, 9_000), None))
    disk.delete(b"k9")
    got = disk.get(b"k8")  # served from the queue or the file, whichever is current
    assert got is not None and is_intact(b"k8", got.data)
    assert disk.get(b"k9") is None and disk.get(b"k0") is None
    disk.close()
    reopened = tier(tmp_path, capacity=60_000)
    assert reopened.stats().entries == 5
    for i in range(4, 9):  # 6 records of 9,070 bytes fit 60,000; k9 was deleted
        got = reopened.get(b"k%d" % i)
        assert got is not None and is_intact(b"k%d" % i, got.data)
    assert reopened.get(b"k9") is None


def test_write_behind_refuses_past_its_queue_budget_and_forgets_refused_writes(tmp_path: Path) -> None:
    disk = DiskTier(DiskTierConfig(directory=tmp_path, write_behind=True, max_pending_bytes=0))
    value = Entry(payload(b"k", 1, 100), None)
    assert disk.put(b"k", value) == [(b"k", value)]  # the queue took nothing: handed back, not stored
    assert disk.get(b"k") is None and disk.stats().entries == 0
    disk.close()


def test_a_store_with_write_behind_disk_never_blocks_on_a_miss_or_a_put(tmp_path: Path) -> None:
    l3 = DiskTierConfig(directory=tmp_path, capacity_bytes=1_000_000, write_behind=True)
    l1 = MemoryTierConfig(name="l1", capacity_bytes=3_000)
    store = TieredStore.from_config(StoreConfig(l1=l1, l2=None, l3=l3))
    assert not store.puts_block
    for i in range(6):
        store.put(b"k%d" % i, payload(b"k%d" % i, 1, 2_000))
    assert store.locate(b"k0") == "l3" and store.get_blocks(b"k0")
    assert store.locate(b"k5") == "l1" and not store.get_blocks(b"k5")
    assert not store.get_blocks(b"never stored")
    store.close()
    synchronous = TieredStore.from_config(StoreConfig(l3=DiskTierConfig(directory=tmp_path)))
    assert synchronous.puts_block
    synchronous.close()


def test_a_stray_file_in_the_segment_folder_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = tier(tmp_path)
    disk.put(b"k", Entry(payload(b"k", 1, 500), None))
    disk.close()
    (tmp_path / "seg" / "junk.rgs").write_bytes(b"not a segment")
    (tmp_path / "seg" / "7.rgs").write_bytes(b"nor this")  # digits, but not a name this tier writes
    with caplog.at_level("WARNING", logger="cachelayer.disk"):
        reopened = tier(tmp_path)
    got = reopened.get(b"k")
    assert got is not None and is_intact(b"k", got.data)
    assert sum("junk.rgs" in message for message in caplog.messages) == 1
    assert sum("7.rgs" in message for message in caplog.messages) == 1
    reopened.close()
    assert (tmp_path / "seg" / "junk.rgs").exists()  # not ours to delete


def test_a_damaged_header_costs_its_own_record_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    disk = tier(tmp_path)
    keys = [b"key%d" % i for i in range(6)]
    for key in keys:
        disk.put(key, Entry(payload(key, 1, 3_000), None))
    disk.close()
    (segment,) = (tmp_path / "seg").glob("*.rgs")
    data = bytearray(segment.read_bytes())
    at = data.find(b"key2") - HEADER_BYTES  # the record's magic: the key follows its header
    assert data[at : at + 4] == MAGIC
    data[at : at + 4] = b"XXXX"
    segment.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="cachelayer.disk"):
        reopened = tier(tmp_path)
    assert reopened.get(b"key2") is None
    for key in keys[:2] + keys[3:]:  # the records after the damage are indexed again
        got = reopened.get(key)
        assert got is not None and is_intact(key, got.data)
    assert reopened.stats().errors == 1
    assert any("1 damaged stretches" in message for message in caplog.messages)
    reopened.close()


def test_a_magic_inside_data_is_not_taken_for_a_record(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    disk.put(b"a", Entry(payload(b"a", 1, 200), None))
    disk.put(b"b", Entry(b"RGC2RGC3" * 25, None))  # data that looks like headers, of either format
    disk.put(b"c", Entry(payload(b"c", 1, 200), None))
    disk.close()
    (segment,) = (tmp_path / "seg").glob("*.rgs")
    data = bytearray(segment.read_bytes())
    data[0:4] = b"XXXX"  # damage record a's header: the scan must resync at b, not inside b's data
    segment.write_bytes(bytes(data))
    reopened = tier(tmp_path)
    assert reopened.get(b"a") is None
    assert reopened.get(b"b") == Entry(b"RGC2RGC3" * 25, None)
    got = reopened.get(b"c")
    assert got is not None and is_intact(b"c", got.data)
    reopened.close()


@pytest.mark.parametrize("delay_s", [0.2, 0.5])
def test_sigkill_during_write_behind_never_leaves_a_wrong_entry(tmp_path: Path, delay_s: float) -> None:
    writer = run_python(f"""
        from pathlib import Path
        from cachelayer.disk import DiskTier, DiskTierConfig
        from cachelayer.tier import Entry
        from tests.cachelayer.test_disk import payload
        directory = Path({str(tmp_path)!r})
        disk = DiskTier(DiskTierConfig(directory=directory, capacity_bytes=4_000_000, write_behind=True))
        version = 0
        while True:
            version += 1
            for i in range(30):
                key = b"key%d" % i
                if disk.has_room(200_000):
                    disk.put(key, Entry(payload(key, version, (version * 7919 + i * 104729) % 200_000), None))
    """)
    deadline = time.monotonic() + 30
    while not any(tmp_path.glob("seg/*.rgs")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay_s)
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(timeout=30) == -signal.SIGKILL
    disk = tier(tmp_path, capacity=4_000_000)
    found = 0
    for i in range(30):
        got = disk.get(b"key%d" % i)
        if got is not None:
            found += 1
            assert is_intact(b"key%d" % i, got.data)
    assert found > 0
    disk.close()


def test_close_with_a_deadline_leaves_the_rest_unwritten_and_readable(tmp_path: Path) -> None:
    disk = DiskTier(DiskTierConfig(directory=tmp_path, write_behind=True, max_pending_bytes=1 << 30))
    keys = [b"k%d" % i for i in range(200)]
    for key in keys:
        disk.put(key, Entry(payload(key, 1, 50_000), None))
    disk.close(deadline=time.monotonic())  # already due: whatever is still queued is dropped
    reopened = tier(tmp_path)
    for key in keys:
        got = reopened.get(key)
        assert got is None or is_intact(key, got.data)
    assert reopened.stats().errors == 0  # dropped writes are each segment's tail: no damage
    reopened.close()
