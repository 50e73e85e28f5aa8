"""FastTransport's pool, timeouts and errors against real loopback servers."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from adapters.http_transport import FastTransport
from tests.adapters.http_transport.servers import Exchange, answer, response, serve


def _client(timeout: httpx.Timeout | float = 5.0, **limits: float | int | None) -> httpx.AsyncClient:
    transport = FastTransport(limits=httpx.Limits(**limits))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, timeout=timeout)


async def _ok(exchange: Exchange) -> bool:
    return await answer(exchange, response(b"ok"))


async def test_read_timeout() -> None:
    async def silent(exchange: Exchange) -> bool:
        await asyncio.sleep(10)
        return False

    async with serve(silent) as server, _client(httpx.Timeout(5.0, read=0.2)) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(server.url)


async def test_read_timeout_between_chunks_of_a_stream() -> None:
    async def stalls(exchange: Exchange) -> bool:
        await answer(exchange, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
        await asyncio.sleep(10)
        return False

    async with (
        serve(stalls) as server,
        _client(httpx.Timeout(5.0, read=0.2)) as client,
        client.stream("GET", server.url) as reply,
    ):
        with pytest.raises(httpx.ReadTimeout):
            async for _ in reply.aiter_raw():
                pass


async def test_write_timeout_when_the_server_does_not_read() -> None:
    async with serve(_ok, read_requests=False) as server, _client(httpx.Timeout(5.0, write=0.3)) as client:
        with pytest.raises(httpx.WriteTimeout):
            await client.post(server.url, content=b"x" * (64 << 20))


async def test_connect_error_on_a_closed_port() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with _client() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/")


async def test_pool_exhaustion_is_a_pool_timeout_and_a_freed_connection_is_handed_over() -> None:
    async with serve(_ok) as server, _client(httpx.Timeout(5.0, pool=0.2), max_connections=1) as client:
        held = await client.send(client.build_request("GET", server.url), stream=True)
        with pytest.raises(httpx.PoolTimeout):
            await client.get(server.url)
        waiting = asyncio.create_task(client.get(server.url))
        await asyncio.sleep(0.05)
        await held.aread()
        await held.aclose()
        assert (await waiting).text == "ok"
    assert server.connections == 1


async def test_idle_connection_closed_by_the_server_is_not_reused() -> None:
    async def once(exchange: Exchange) -> bool:
        return await answer(exchange, response(b"ok"), keep_open=False)  # no `connection: close`

    async with serve(once) as server, _client() as client:
        await client.get(server.url)
        await asyncio.sleep(0.05)  # the FIN arrives while the connection is idle
        assert (await client.get(server.url)).text == "ok"
    assert server.connections == 2


async def _close_on_reuse(exchange: Exchange) -> bool:
    """Serves the first request of a connection; drops any later one unanswered (a stale keep-alive)."""
    if exchange.request.index_on_connection > 0:
        return False
    return await answer(exchange, response(b"ok"))


async def test_stale_connection_is_retried_once_for_an_idempotent_request() -> None:
    async with serve(_close_on_reuse) as server, _client() as client:
        await client.get(server.url)
        assert (await client.get(server.url)).text == "ok"
    assert server.connections == 2
    assert [(r.connection, r.index_on_connection) for r in server.received] == [(0, 0), (0, 1), (1, 0)]


async def test_stale_connection_fails_a_post_without_sending_it_twice() -> None:
    async with serve(_close_on_reuse) as server, _client() as client:
        await client.post(server.url, content=b"a")
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(server.url, content=b"b")
    assert [r.body for r in server.received] == [b"a", b"b"]


async def test_server_dropping_mid_body_is_a_protocol_error() -> None:
    async def truncated(exchange: Exchange) -> bool:
        return await answer(exchange, b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", keep_open=False)

    async with serve(truncated) as server, _client() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(server.url)


async def test_garbage_is_a_protocol_error() -> None:
    async def garbage(exchange: Exchange) -> bool:
        return await answer(exchange, b"SMTP ready\r\n\r\n")

    async with serve(garbage) as server, _client() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(server.url)


async def test_closing_a_stream_early_closes_the_upstream_connection() -> None:
    async def endless(exchange: Exchange) -> bool:
        await answer(exchange, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            await answer(exchange, b"6\r\nchunk\n\r\n")
            await asyncio.sleep(0.01)

    async with serve(endless) as server, _client() as client:
        async with client.stream("GET", server.url) as reply:
            async for _ in reply.aiter_raw():
                break
        await asyncio.wait_for(server.closed_by_peer.wait(), 1.0)


async def test_cancelling_before_the_answer_closes_the_connection() -> None:
    gone = asyncio.Event()

    async def slow(exchange: Exchange) -> bool:
        if not await exchange.reader.read(1):  # the client hung up before any answer
            gone.set()
        return False

    async with serve(slow) as server, _client() as client:
        request = asyncio.create_task(client.get(server.url))
        await asyncio.sleep(0.1)
        request.cancel()
        await asyncio.wait_for(gone.wait(), 1.0)


async def test_idle_connections_expire() -> None:
    async with serve(_ok) as server, _client(keepalive_expiry=0.05) as client:
        await client.get(server.url)
        await asyncio.sleep(0.1)
        await client.get(server.url)
    assert server.connections == 2


async def test_max_keepalive_bounds_idle_connections() -> None:
    async def slow_ok(exchange: Exchange) -> bool:
        await asyncio.sleep(0.05)
        return await answer(exchange, response(b"ok"))

    async with serve(slow_ok) as server, _client(max_keepalive_connections=1) as client:
        await asyncio.gather(*(client.get(server.url) for _ in range(3)))
        await asyncio.gather(*(client.get(server.url) for _ in range(3)))
    assert server.connections == 5  # 3, then the one kept + 2 new


async def test_a_full_pool_closes_an_idle_connection_to_another_origin() -> None:
    async with (
        serve(_ok) as first,
        serve(_ok) as second,
        _client(httpx.Timeout(5.0, pool=0.2), max_connections=1) as client,
    ):
        await client.get(first.url)
        assert (await client.get(second.url)).text == "ok"  # not a PoolTimeout
        await asyncio.wait_for(first.closed_by_peer.wait(), 1.0)
