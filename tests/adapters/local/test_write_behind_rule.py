"""The write-behind rule on its own (no model): which pages are due, how many a step writes, and what
a full writer queue or a deadline does. A fake offload stands for the L3 tier."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from adapters.local.write_behind import RETRY_WHEN_FULL_S, WriteBehind


@dataclass
class FakeOffload:
    page_bytes: int = 1000
    room: bool = True
    disk: set[bytes] = field(default_factory=set)
    written: list[tuple[bytes, int]] = field(default_factory=list)

    def on_disk(self, key: bytes) -> bool:
        return key in self.disk

    def disk_has_room(self) -> bool:
        return self.room

    def persist(self, key: bytes, page: int) -> bool:
        self.written.append((key, page))
        self.disk.add(key)
        return True

    def persist_now(self, key: bytes, page: int, deadline: float) -> bool:
        return self.persist(key, page)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    after_s: float = 5.0, per_step: int = 2, busy_bytes_per_s: float = 1e9
) -> tuple[WriteBehind, FakeOffload, Clock]:
    offload, clock = FakeOffload(), Clock()
    writer = WriteBehind(
        cast(Any, offload),
        after_s=after_s,
        pages_per_step=per_step,
        busy_bytes_per_s=busy_bytes_per_s,
        clock=clock,
    )
    return writer, offload, clock


def pairs(pages: range) -> list[tuple[int, bytes]]:
    return [(page, b"key%d" % page) for page in pages]


def test_nothing_is_written_before_a_page_is_reused_or_old() -> None:
    writer, offload, clock = make()
    writer.track(pairs(range(3)))
    assert writer.step(busy=False) == 5.0  # the oldest page is due in after_s
    clock.now += 4.9
    assert writer.step(busy=False) is not None and offload.written == []
    clock.now += 0.2
    writer.step(busy=False)
    assert [page for _, page in offload.written] == [0, 1]  # two per step, oldest first
    writer.step(busy=False)
    assert writer.pending_pages == 0 and writer.written_pages == 3
    assert writer.step(busy=False) is None


def test_a_reused_page_is_due_at_once_and_goes_first() -> None:
    writer, offload, _ = make(per_step=1)
    writer.track(pairs(range(4)))
    writer.used([2, 3])
    assert writer.step(busy=False) == 0.0  # one more is due: come back at once
    assert writer.step(busy=False) == 5.0
    assert [page for _, page in offload.written] == [2, 3]


def test_pages_already_on_disk_or_evicted_are_not_written() -> None:
    writer, offload, clock = make(after_s=0.0)
    offload.disk.add(b"key0")
    writer.track(pairs(range(3)))
    writer.forget([1])  # evicted: the offload saved it its own way
    clock.now += 1
    writer.step(busy=False)
    assert [page for _, page in offload.written] == [2]


def test_a_full_writer_queue_defers_the_write() -> None:
    writer, offload, _ = make(after_s=0.0)
    writer.track(pairs(range(2)))
    offload.room = False
    assert writer.step(busy=False) == RETRY_WHEN_FULL_S and offload.written == []
    offload.room = True
    writer.step(busy=False)
    assert len(offload.written) == 2


def test_the_flush_writes_every_tracked_page_until_its_deadline() -> None:
    writer, offload, _ = make(after_s=1e9)
    writer.track(pairs(range(5)))
    assert writer.flush(deadline=0.0).written == 0  # a deadline already past: nothing
    result = writer.flush(deadline=float("inf"))
    assert (result.written, result.left) == (5, 0) and len(offload.written) == 5


def test_a_busy_engine_writes_within_its_byte_budget() -> None:
    writer, offload, clock = make(after_s=0.0, per_step=4, busy_bytes_per_s=2000)  # 2 pages a second
    writer.track(pairs(range(10)))
    writer.step(busy=True)
    assert len(offload.written) == 4  # the burst: one iteration's worth
    clock.now += 0.25
    assert writer.step(busy=True) == 0.25  # half a page of budget: the next page in 0.25 s
    assert len(offload.written) == 4
    clock.now += 1.0
    writer.step(busy=True)
    assert len(offload.written) == 6  # 1.25 s of budget, capped at the burst: two more pages
    writer.step(busy=False)  # idle: only the per-iteration bound
    assert len(offload.written) == 10
