"""`DisconnectWatch`: the `receive()` side task that cancels a handler whose client left."""

from __future__ import annotations

import asyncio

import pytest

from proxy.asgi_types import Message
from proxy.disconnect import DisconnectWatch


async def never_answered() -> None:
    await asyncio.sleep(10)


async def test_a_disarmed_watch_ignores_a_disconnect() -> None:
    messages: asyncio.Queue[Message] = asyncio.Queue()
    watch = DisconnectWatch(messages.get)
    watch.arm()
    watch.disarm()
    await messages.put({"type": "http.disconnect"})
    await asyncio.sleep(0)
    assert not watch.fired


async def test_a_side_task_waits_for_http_disconnect_and_cancels_the_handler() -> None:
    messages: asyncio.Queue[Message] = asyncio.Queue()
    watch = DisconnectWatch(messages.get)

    async def handler() -> None:
        watch.arm()
        await never_answered()

    task = asyncio.create_task(handler())
    await asyncio.sleep(0)
    await messages.put({"type": "http.disconnect"})
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)
    assert watch.fired
