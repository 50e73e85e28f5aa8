"""Connection bookkeeping for one transport: idle keep-alive stacks per origin, and connection slots.

    take_idle  pop the newest idle connection of the origin (LIFO: the warmest socket, and the
               oldest ones expire at the bottom of the stack)
    reserve    else a slot to open one, else wait up to the pool timeout (PoolTimeout)
    release    a response read whole on a keep-alive connection goes to the first waiter of its
               origin or back on its stack; anything else is closed and its slot passed on
    lost       a connection the server closed while idle leaves the pool at once

Checkout and release are O(1): no scan of the pool per request.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import NamedTuple

import httpx

from adapters.http_transport.connection import Connection, Origin


class PoolLimits(NamedTuple):
    """httpx.Limits as plain values; None means unlimited (or, for the expiry, never)."""

    max_connections: int | None
    max_keepalive: int | None
    keepalive_expiry_s: float | None

    @classmethod
    def of(cls, limits: httpx.Limits) -> PoolLimits:
        return cls(limits.max_connections, limits.max_keepalive_connections, limits.keepalive_expiry)


class _Waiter(NamedTuple):
    origin: Origin
    future: asyncio.Future[Connection | None]
    """Resolves to an idle connection handed over, or None: a slot to open a new one."""


class ConnectionPool:
    """Idle connections and connection slots under `PoolLimits`."""

    def __init__(self, limits: PoolLimits) -> None:
        self._limits = limits
        self._idle: dict[Origin, collections.deque[Connection]] = {}
        self._slots_used = 0
        self._waiters: collections.deque[_Waiter] = collections.deque()

    def take_idle(self, origin: Origin) -> Connection | None:
        """The newest idle connection to `origin` still open and unexpired, if any."""
        idle = self._idle.get(origin)
        if not idle:
            return None
        self._drop_expired(idle, time.monotonic())
        while idle:
            conn = idle.pop()
            conn.in_pool = False
            if not conn.closed:
                return conn
            self.forget(conn)
        return None

    async def reserve(self, origin: Origin, timeout_s: float | None) -> Connection | None:
        """A slot to open a new connection to `origin` (None), or a connection a finished
        response handed over while waiting; PoolTimeout after `timeout_s`."""
        if self._slot_free() or (self._close_one_idle() and self._slot_free()):
            self._slots_used += 1  # (an idle connection to another origin may have given its slot up)
            return None
        return await self._wait(origin, timeout_s)

    def _slot_free(self) -> bool:
        return self._limits.max_connections is None or self._slots_used < self._limits.max_connections

    def opened(self, conn: Connection, origin: Origin) -> None:
        """`conn` was opened to `origin` on a slot reserved by `checkout`."""
        conn.origin = origin
        conn.holds_slot = True

    def release(self, conn: Connection) -> None:
        """The response on `conn` is over: keep the connection for reuse if it can be, else close it."""
        origin = conn.origin
        if not conn.reusable():
            self.discard(conn)
            return
        conn.reused = True
        for index, waiter in enumerate(self._waiters):
            if waiter.origin == origin and not waiter.future.done():
                del self._waiters[index]
                waiter.future.set_result(conn)
                return
        idle = self._idle.setdefault(origin, collections.deque())
        max_keepalive = self._limits.max_keepalive
        if (max_keepalive is not None and len(idle) >= max_keepalive) or self._waiters:
            self.discard(conn)  # waiters of other origins need the slot more
            return
        now = time.monotonic()
        self._drop_expired(idle, now)
        conn.idle_since = now
        conn.in_pool = True
        idle.append(conn)

    def discard(self, conn: Connection) -> None:
        """Close `conn` and give its slot to a waiter, or back."""
        conn.close()
        self.forget(conn)

    def forget(self, conn: Connection) -> None:
        """`conn` closed (the server, or `discard`): take it off the pool and free its slot once."""
        if conn.in_pool:
            conn.in_pool = False
            idle = self._idle.get(conn.origin)
            if idle is not None and conn in idle:
                idle.remove(conn)
        if conn.holds_slot:
            conn.holds_slot = False
            self.free_slot()

    def free_slot(self) -> None:
        """A reserved slot was not used (connecting failed) or its connection closed."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(None)  # the slot passes to the waiter as is
                return
        self._slots_used -= 1

    def close(self) -> None:
        """Close every idle connection (busy ones close when their response ends)."""
        for idle in list(self._idle.values()):
            while idle:
                self.discard(idle.pop())
        self._idle.clear()

    def _drop_expired(self, idle: collections.deque[Connection], now: float) -> None:
        expiry = self._limits.keepalive_expiry_s
        if expiry is None:
            return
        while idle and now - idle[0].idle_since >= expiry:  # the oldest sit at the bottom
            self.discard(idle[0])

    def _close_one_idle(self) -> bool:
        for idle in self._idle.values():
            if idle:
                self.discard(idle[0])
                return True
        return False

    async def _wait(self, origin: Origin, timeout_s: float | None) -> Connection | None:
        future: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(origin, future)
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            self._give_back(origin, future)
            raise httpx.PoolTimeout("no connection to the upstream became free in time") from None
        except BaseException:
            self._give_back(origin, future)
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _give_back(self, origin: Origin, future: asyncio.Future[Connection | None]) -> None:
        """A waiter gave up (timeout, cancellation) just as it was served: pass on what it got."""
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            conn = future.result()
            if conn is None:
                self.free_slot()
            else:
                self.release(conn)
