"""CPU per request of the upstream HTTP client alone, against the stub, for client settings.

Runs `--requests` POSTs with `--concurrency` tasks (each waits for its answer before sending the
next) and reports CPU microseconds per request of this process. Pin it to its own core:

    taskset -c 0 python -m benchmarks.overhead.client_cost --port 9181 --concurrency 1
    taskset -c 0 python -m benchmarks.overhead.client_cost --port 9181 --concurrency 64

Variants: httpx with the gateway's limits (1024 connections, 256 kept alive), httpx with a
keep-alive pool sized to the concurrency, the stdlib asyncio loop instead of uvloop, httpx over
`asyncio_backend.AsyncioBackend` instead of httpcore's anyio backend, and httpx over
`adapters.http_transport.FastTransport` (no httpcore at all; the gateway's default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import httpx
import uvloop

from adapters.http_transport import FastTransport
from benchmarks.overhead.asyncio_backend import fast_transport

TRACE_HEADERS = {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"}
BODY = b'{"model":"stub-model","messages":[{"role":"user","content":"Say something."}],"max_tokens":16}'


async def _drive(
    send: Callable[[], Awaitable[bytes]], requests: int, concurrency: int, idle_connections: int
) -> float:
    for _ in range(concurrency * 4):  # warm connections and caches
        await send()
    # Open `idle_connections` at once so the pool holds that many keep-alive connections (as after a burst).
    await asyncio.gather(*(send() for _ in range(idle_connections)))
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await send()

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.process_time() - started) / requests * 1e6


async def _httpx(
    url: str, limits: httpx.Limits, client: str, requests: int, concurrency: int, idle_connections: int
) -> float:
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    transport: httpx.AsyncBaseTransport | None = None
    if client == "asyncio-backend":
        transport = fast_transport(limits=limits)
    elif client == "fast":
        transport = FastTransport(limits=limits)
    async with httpx.AsyncClient(
        limits=limits, headers=headers, trust_env=False, transport=transport
    ) as client:

        async def send() -> bytes:
            response = await client.post(
                url, content=BODY, headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
            )
            return response.content

        return await _drive(send, requests, concurrency, idle_connections)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--idle-connections",
        type=int,
        default=0,
        help="keep-alive connections opened by a burst before timing",
    )
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}/v1/chat/completions"
    gateway_limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=30)
    sized_limits = httpx.Limits(
        max_connections=1024, max_keepalive_connections=max(8, args.concurrency), keepalive_expiry=30
    )
    variants = {
        "httpx_gateway_limits_uvloop": (uvloop.run, gateway_limits, "httpcore"),
        "httpx_gateway_limits_asyncio": (asyncio.run, gateway_limits, "httpcore"),
        "httpx_sized_pool_uvloop": (uvloop.run, sized_limits, "httpcore"),
        "httpx_asyncio_backend_uvloop": (uvloop.run, gateway_limits, "asyncio-backend"),
        "httpx_fast_transport_uvloop": (uvloop.run, gateway_limits, "fast"),
    }
    results = {}
    for name, (runner, limits, client) in variants.items():
        timed = _httpx(url, limits, client, args.requests, args.concurrency, args.idle_connections)
        results[name] = round(runner(timed), 1)
    print(
        json.dumps(
            {
                "concurrency": args.concurrency,
                "idle_connections": args.idle_connections,
                "cpu_us_per_request": results,
            }
        )
    )


if __name__ == "__main__":
    main()
