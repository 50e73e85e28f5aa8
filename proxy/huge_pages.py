"""Move the gateway's heap onto transparent huge pages once it has started (Linux only).

At a low request rate every request wakes an idle process, and the first touch of each 4 KiB page
after the wake costs a TLB miss (a nested page walk on a virtual machine). The long-lived objects a
request reads (code objects, modules, classes, the app's own state) are spread over tens of MiB of
heap, one TLB entry per 4 KiB page; on 2 MiB pages far fewer entries cover them. `collapse_heap`
asks the kernel (`madvise(MADV_COLLAPSE)`, Linux >= 6.1, THP not "never") to rebuild the heap's
2 MiB-aligned ranges as huge pages, synchronously and best effort. Measured in
`benchmarks/RESULTS.md` "## overhead" (CPU per request at 100 requests/s).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

MADV_COLLAPSE = 25
"""From linux/mman.h (since 6.1)."""
HUGE_PAGE = 2 << 20
"""Bytes in a transparent huge page on x86-64 and arm64 with 4 KiB base pages."""


MIN_RESIDENT = 0.5
"""Mappings less resident than this (thread stacks, reserved space) are left alone: a collapse
fills a huge page whole, so it would grow the resident memory by what the range never used."""


def collapse_heap(smaps: Path = Path("/proc/self/smaps")) -> int:
    """Collapse every 2 MiB-aligned range of the process's mostly resident private anonymous
    read-write mappings (the Python heap, malloc's heap) into huge pages; returns the bytes collapsed
    (0 where the kernel or the platform cannot: nothing changes then)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        lines = smaps.read_text().splitlines()
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    collapsed = 0
    for start, end in _anonymous_ranges(lines):
        if madvise(start, end - start, MADV_COLLAPSE) == 0:
            collapsed += end - start
    return collapsed


def _anonymous_ranges(lines: list[str]) -> list[tuple[int, int]]:
    """The 2 MiB-aligned parts of the private anonymous (or `[heap]`) read-write mappings that are at
    least `MIN_RESIDENT` resident, from /proc/self/smaps."""
    ranges = []
    candidate: tuple[int, int] | None = None
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
            candidate = None
            anonymous = len(fields) == 5 or (len(fields) == 6 and fields[5] == "[heap]")
            if anonymous and fields[1].startswith("rw") and fields[1][3] == "p":
                low, high = (int(bound, 16) for bound in fields[0].split("-"))
                candidate = (low, high)
        elif fields[0] == "Rss:" and candidate is not None:
            low, high = candidate
            start = -(-low // HUGE_PAGE) * HUGE_PAGE
            end = high // HUGE_PAGE * HUGE_PAGE
            if end > start and int(fields[1]) * 1024 >= MIN_RESIDENT * (high - low):
                ranges.append((start, end))
    return ranges
