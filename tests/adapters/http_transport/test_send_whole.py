"""`UpstreamClient.post` over `FastTransport.send_whole`: the request path's POSTs, read whole."""

from __future__ import annotations

import asyncio
import gzip

import httpx
import pytest

from adapters.upstream_client import UpstreamClient, UpstreamClientConfig
from tests.adapters.http_transport.servers import Exchange, answer, response, serve

HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


async def post_once(base_url: str) -> httpx.Response:
    """One `UpstreamClient.post` of `{}` to `/v1/completions`, on a client closed afterwards."""
    client = UpstreamClient(UpstreamClientConfig(), HEADERS)
    try:
        return await client.post(httpx.URL(base_url + "/v1/completions"), b"{}", None)
    finally:
        await client.aclose()


async def test_post_sends_head_headers_and_body_and_reuses_the_connection() -> None:
    async def respond(exchange: Exchange) -> bool:
        return await answer(exchange, response(b"echo " + exchange.request.body, status=201))

    async with serve(respond) as server:
        client = UpstreamClient(UpstreamClientConfig(), HEADERS)
        url = httpx.URL(server.url + "/v1/chat/completions")
        try:
            first = await client.post(url, b'{"a":1}', {"traceparent": "00-ab-cd-01"})
            second = await client.post(url, b'{"b":2}', None)
        finally:
            await client.aclose()
    assert (first.status_code, first.content) == (201, b'echo {"a":1}')
    assert second.content == b'echo {"b":2}'
    assert server.connections == 1
    request = server.received[0]
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["host"] == f"127.0.0.1:{server.port}"
    assert request.headers["content-length"] == "7"
    assert request.headers["traceparent"] == "00-ab-cd-01"
    assert request.headers["accept-encoding"] == "identity"
    assert "traceparent" not in server.received[1].headers


async def test_large_answer_is_read_whole_past_the_read_high_water() -> None:
    payload = bytes(range(256)) * (12 << 12)  # 12 MiB: the socket pauses and resumes reading

    async def respond(exchange: Exchange) -> bool:
        return await answer(exchange, response(payload))

    async with serve(respond) as server:
        reply = await post_once(server.url)
    assert reply.content == payload


async def test_a_chunked_and_gzip_encoded_answer_is_decoded() -> None:
    compressed = gzip.compress(b'{"ok":true}')

    async def respond(exchange: Exchange) -> bool:
        exchange.writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-encoding: gzip\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(compressed), compressed)
        )
        await exchange.writer.drain()
        return True

    async with serve(respond) as server:
        reply = await post_once(server.url)
    assert reply.content == b'{"ok":true}'


async def test_a_dropped_connection_is_an_httpx_error_and_the_post_is_not_sent_twice() -> None:
    async def respond(exchange: Exchange) -> bool:
        if exchange.request.body == b"second":
            return False  # closed without an answer
        return await answer(exchange, response(b"ok"))

    async with serve(respond) as server:
        client = UpstreamClient(UpstreamClientConfig(), HEADERS)
        url = httpx.URL(server.url + "/v1/completions")
        try:
            assert (await client.post(url, b"first", None)).content == b"ok"
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(url, b"second", None)
            assert (await client.post(url, b"third", None)).content == b"ok"
        finally:
            await client.aclose()
    assert [r.body for r in server.received] == [b"first", b"second", b"third"]


async def test_an_answer_split_over_several_writes_is_read_whole() -> None:
    payload = b'{"id":"x"}' * 50

    async def respond(exchange: Exchange) -> bool:
        data = response(payload, headers="x-upstream: a\r\n")
        for part in (data[:7], data[7:40], data[40:-5], data[-5:]):
            exchange.writer.write(part)
            await exchange.writer.drain()
            await asyncio.sleep(0.02)
        return True

    async with serve(respond) as server:
        client = UpstreamClient(UpstreamClientConfig(), HEADERS)
        url = httpx.URL(server.url + "/v1/completions")
        try:
            replies = [await client.post(url, b"{}", None) for _ in range(2)]
        finally:
            await client.aclose()
    assert [(reply.status_code, reply.content) for reply in replies] == [(200, payload)] * 2
    assert server.connections == 1


async def test_a_silent_upstream_times_out_and_a_shorter_timeout_after_a_longer_one_holds() -> None:
    async def first_only(exchange: Exchange) -> bool:
        if exchange.request.index_on_connection == 0:
            return await answer(exchange, response(b"ok"))
        await asyncio.sleep(10)
        return False

    async with serve(first_only) as server:
        client = UpstreamClient(UpstreamClientConfig(read_timeout_s=5.0), HEADERS)
        try:
            assert (await client.post(httpx.URL(server.url + "/a"), b"{}", None)).content == b"ok"
            started = asyncio.get_running_loop().time()
            with pytest.raises(httpx.ReadTimeout):  # the same connection, with its 5 s timer armed
                await client.http.get(server.url + "/b", timeout=0.2)
            assert asyncio.get_running_loop().time() - started < 2
        finally:
            await client.aclose()
