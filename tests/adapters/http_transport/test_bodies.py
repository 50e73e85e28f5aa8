"""FastTransport against real loopback servers: body framings, 1xx, large bodies both ways."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from adapters.http_transport import FastTransport
from tests.adapters.http_transport.servers import Exchange, answer, response, serve


def _client(**limits: float | int | None) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=FastTransport(limits=httpx.Limits(**limits)), timeout=5.0)  # type: ignore[arg-type]


async def test_content_length_bodies_reuse_one_connection() -> None:
    async def respond(exchange: Exchange) -> bool:
        return await answer(exchange, response(b"hello " + exchange.request.path.encode()))

    async with serve(respond) as server, _client() as client:
        for path in ("/a", "/b", "/c"):
            reply = await client.get(server.url + path)
            assert (reply.status_code, reply.text) == (200, f"hello {path}")
    assert server.connections == 1
    assert [r.index_on_connection for r in server.received] == [0, 1, 2]


async def test_chunked_response_arrives_piece_by_piece_and_keeps_the_connection() -> None:
    async def respond(exchange: Exchange) -> bool:
        exchange.writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in (b"data: 1\n\n", b"data: 2\n\n"):
            exchange.writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await exchange.writer.drain()
            await asyncio.sleep(0.02)
        return await answer(exchange, b"0\r\n\r\n")

    async with serve(respond) as server, _client() as client:
        async with client.stream("GET", server.url) as reply:
            pieces = [piece async for piece in reply.aiter_raw()]
        assert pieces == [b"data: 1\n\n", b"data: 2\n\n"]
        assert (await client.get(server.url)).content == b"data: 1\n\ndata: 2\n\n"
    assert server.connections == 1


async def test_close_delimited_body_is_read_to_eof_and_the_connection_not_reused() -> None:
    async def respond(exchange: Exchange) -> bool:
        exchange.writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ")
        await exchange.writer.drain()
        await asyncio.sleep(0.02)
        return await answer(exchange, b"the end", keep_open=False)

    async with serve(respond) as server, _client() as client:
        assert (await client.get(server.url)).text == "until the end"
        assert (await client.get(server.url)).text == "until the end"
    assert server.connections == 2


async def test_connection_close_header_is_honoured_even_if_the_server_keeps_the_socket() -> None:
    async def respond(exchange: Exchange) -> bool:
        return await answer(exchange, response(b"ok", headers="connection: close\r\n"))

    async with serve(respond) as server, _client() as client:
        await client.get(server.url)
        await client.get(server.url)
    assert server.connections == 2


async def test_informational_responses_are_skipped() -> None:
    async def respond(exchange: Exchange) -> bool:
        exchange.writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n")
        return await answer(exchange, response(b"final", status=201))

    async with serve(respond) as server, _client() as client:
        reply = await client.post(server.url, content=b"x")
        assert (reply.status_code, reply.text, "link" in reply.headers) == (201, "final", False)
        assert (await client.get(server.url)).status_code == 201
    assert server.connections == 1


async def test_no_body_statuses_and_head_requests() -> None:
    async def respond(exchange: Exchange) -> bool:
        if exchange.request.method == "HEAD":
            return await answer(exchange, b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
        return await answer(exchange, b"HTTP/1.1 204 No Content\r\n\r\n")

    async with serve(respond) as server, _client() as client:
        assert (await client.delete(server.url)).content == b""
        head = await client.head(server.url)
        assert (head.status_code, head.headers["content-length"], head.content) == (200, "1000", b"")
        assert (await client.delete(server.url)).status_code == 204


async def test_large_bodies_both_ways() -> None:
    size = 8 << 20
    payload = bytes(range(256)) * (size // 256)

    async def respond(exchange: Exchange) -> bool:
        received = exchange.request.body
        assert received == payload
        return await answer(exchange, response(received[::-1]))

    async with serve(respond) as server, _client() as client:
        reply = await client.post(server.url, content=payload)
        assert reply.content == payload[::-1]


async def test_streamed_request_body_goes_chunked() -> None:
    async def parts() -> AsyncIterator[bytes]:
        for index in range(64):
            yield bytes([index]) * 65536

    async def respond(exchange: Exchange) -> bool:
        body = exchange.request.body
        note = f"{exchange.request.headers.get('transfer-encoding')} {len(body)} {body[-1]}"
        return await answer(exchange, response(note.encode()))

    async with serve(respond) as server, _client() as client:
        reply = await client.post(server.url, content=parts())
        assert reply.text == f"chunked {64 * 65536} 63"


async def test_https_goes_through_httpx_own_transport_with_tls() -> None:
    first_bytes: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first_bytes.append(await reader.read(1))
        writer.close()

    server = await asyncio.start_server(record, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with _client() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"https://127.0.0.1:{port}/")
    finally:
        server.close()
    assert first_bytes == [b"\x16"]  # a TLS handshake record, not a plain-text request
