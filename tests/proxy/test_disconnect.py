"""`DisconnectWatch`: the server's connection-loss hook, and the `receive()` side task without one."""

from __future__ import annotations

import asyncio

import pytest

from proxy.asgi_types import Message
from proxy.disconnect import DISCONNECT_EXTENSION, ConnectionLossHook, DisconnectWatch


async def never_answered() -> None:
    await asyncio.sleep(10)


async def test_a_lost_connection_cancels_the_armed_task_through_the_hook() -> None:
    hook = ConnectionLossHook()
    scope = {"extensions": {DISCONNECT_EXTENSION: {"hook": hook}}}

    async def receive() -> Message:
        raise AssertionError("with a hook, nothing waits on receive()")

    watch = DisconnectWatch(receive, scope)  # type: ignore[arg-type]

    async def handler() -> str:
        watch.arm()
        try:
            await never_answered()
        except asyncio.CancelledError:
            assert watch.fired
            watch.absorb()
            return "absorbed"
        return "finished"

    task = asyncio.create_task(handler())
    await asyncio.sleep(0)
    hook.lost()
    assert await asyncio.wait_for(task, 1) == "absorbed"


async def test_a_disarmed_watch_ignores_a_lost_connection() -> None:
    hook = ConnectionLossHook()
    watch = DisconnectWatch(lambda: never_answered(), {"extensions": {DISCONNECT_EXTENSION: {"hook": hook}}})  # type: ignore[arg-type,return-value]
    watch.arm()
    watch.disarm()
    hook.lost()
    assert not watch.fired


async def test_without_a_hook_a_side_task_waits_for_http_disconnect() -> None:
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
