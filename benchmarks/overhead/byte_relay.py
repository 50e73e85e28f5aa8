"""A byte relay on uvloop: the least any Python proxy on this host pays per request.

Each client connection gets its own connection to the upstream; bytes go through unread in both
directions (no HTTP parsing, no routing, no logging). It wakes, reads and writes as often as a proxy
must (one read and one write each way per request), so its CPU per request is the host's floor for a
Python proxy: `run.py --baseline-relay` measures it in the same rounds as the gateway, which makes
the gateway's CPU figure comparable across hosts as a ratio.

    python -m benchmarks.overhead.byte_relay --upstream-port 9100 --port 9102
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import uvloop


class _UpstreamSide(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self._client = client

    def data_received(self, data: bytes) -> None:
        self._client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.close()


class _ClientSide(asyncio.Protocol):
    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._upstream: asyncio.Transport | None = None
        self._pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await loop.create_connection(
                lambda: _UpstreamSide(self._transport), "127.0.0.1", self._upstream_port
            )
        except OSError:
            self._transport.close()
            return
        self._upstream = upstream
        for data in self._pending:
            upstream.write(data)
        self._pending.clear()

    def data_received(self, data: bytes) -> None:
        if self._upstream is None:
            self._pending.append(data)
        else:
            self._upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._upstream is not None:
            self._upstream.close()


async def serve(port: int, upstream_port: int) -> None:
    server = await asyncio.get_running_loop().create_server(
        lambda: _ClientSide(upstream_port), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.upstream_port))


if __name__ == "__main__":
    main()
