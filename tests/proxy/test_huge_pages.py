"""`collapse_heap`: which mappings it asks the kernel to put on huge pages, and that it never fails."""

from __future__ import annotations

from pathlib import Path

from proxy.huge_pages import HUGE_PAGE, _anonymous_ranges, collapse_heap

SMAPS = """\
55d0c0000000-55d0c0a00000 rw-p 00000000 00:00 0                          [heap]
Size:              10240 kB
Rss:                9000 kB
7f0000100000-7f0000700000 rw-p 00000000 00:00 0
Size:               6144 kB
Rss:                6144 kB
7f0001000000-7f0001800000 rw-p 00000000 00:00 0
Size:               8192 kB
Rss:                  64 kB
7f0002000000-7f0002400000 rw-p 00000000 fe:00 26933                      /usr/lib/libpython3.11.so.1.0
Size:               4096 kB
Rss:                4096 kB
7f0003000000-7f0003400000 r-xp 00000000 00:00 0
Size:               4096 kB
Rss:                4096 kB
7f0004000000-7f0004400000 rw-s 00000000 00:01 7                          /dev/zero (deleted)
Size:               4096 kB
Rss:                4096 kB
7f0005100000-7f0005300000 rw-p 00000000 00:00 0
Size:               2048 kB
Rss:                2048 kB
"""


def test_only_mostly_resident_private_anonymous_read_write_ranges_2mib_aligned() -> None:
    ranges = _anonymous_ranges(SMAPS.splitlines())
    assert ranges == [
        (0x55D0C0000000, 0x55D0C0A00000),  # the heap, already aligned
        (0x7F0000200000, 0x7F0000600000),  # trimmed to whole huge pages inside
    ]  # not: a thread stack (1% resident), a file, executable, shared, or too short once aligned
    assert all(start % HUGE_PAGE == 0 and end % HUGE_PAGE == 0 for start, end in ranges)


def test_collapse_is_best_effort(tmp_path: Path) -> None:
    assert collapse_heap(tmp_path / "missing") == 0
    collapsed = collapse_heap()  # this process: whatever the kernel grants, and no exception
    assert collapsed >= 0 and collapsed % HUGE_PAGE == 0
