"""The engine thread's events reach each loop's queues in order, with one wake-up per batch."""

from __future__ import annotations

import asyncio
import threading

from adapters.local.delivery import LoopMailbox, Mailboxes


async def test_a_batch_posted_from_another_thread_arrives_in_order_with_one_wakeup() -> None:
    loop = asyncio.get_running_loop()
    mailbox: LoopMailbox[int] = LoopMailbox(loop)
    queues: list[asyncio.Queue[int]] = [asyncio.Queue() for _ in range(3)]
    wakeups = 0
    original = loop.call_soon_threadsafe

    def counting(callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal wakeups
        wakeups += 1
        return original(callback, *args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:

        def engine_step() -> None:
            for item in range(6):
                mailbox.post(queues[item % 3], item)

        thread = threading.Thread(target=engine_step)
        thread.start()
        thread.join()
        got = [[await asyncio.wait_for(q.get(), 1.0) for _ in range(2)] for q in queues]
    finally:
        del loop.call_soon_threadsafe
    assert got == [[0, 3], [1, 4], [2, 5]]
    assert wakeups == 1  # the loop did not run between the posts, so they shared one wake-up


async def test_a_later_post_wakes_the_loop_again() -> None:
    mailbox: LoopMailbox[str] = Mailboxes[str]().for_loop(asyncio.get_running_loop())
    queue: asyncio.Queue[str] = asyncio.Queue()
    await asyncio.to_thread(mailbox.post, queue, "first")
    assert await asyncio.wait_for(queue.get(), 1.0) == "first"
    await asyncio.to_thread(mailbox.post, queue, "second")
    assert await asyncio.wait_for(queue.get(), 1.0) == "second"


def test_each_loop_gets_its_own_mailbox() -> None:
    boxes: Mailboxes[int] = Mailboxes()
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert boxes.for_loop(first) is boxes.for_loop(first)
        assert boxes.for_loop(first) is not boxes.for_loop(second)
    finally:
        first.close()
        second.close()


def test_posting_to_a_closed_loop_is_not_an_error() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    LoopMailbox[int](loop).post(asyncio.Queue(), 1)
