"""The fast transport reads upstream answers exactly as h11 does: the same response bytes, read whole
(`send_whole`, the request path's POSTs) and as a stream, give h11's verdict.

A verdict is the status, the header fields and the body, or "error" when the bytes are not a valid
HTTP/1.1 response (a whole answer keeps only its status and body, all the request path reads of it).
Where llhttp (httptools, inside the transport) and h11 would part, the transport must not be the more
lenient: `STRICTER_THAN_H11` lists the cases where it refuses what h11 reads.
"""

from __future__ import annotations

import h11
import httpx
import pytest

from adapters.upstream_client import UpstreamClient, UpstreamClientConfig
from tests.adapters.http_transport.servers import Exchange, answer, serve

Verdict = tuple[int, list[tuple[bytes, bytes]], bytes] | str

CASES: dict[str, bytes] = {
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n",
    "until-eof": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it",
    "informational-first": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "error-status": b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
    **{
        f"header-name {name!r}": b"HTTP/1.1 200 OK\r\n%s: 1\r\nContent-Length: 2\r\n\r\nok" % name
        for name in (b"X(y)", b"X@y", b'X"y', b"X/y")
    },
    "duplicate-content-length": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
    "conflicting-content-length": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!",
    "content-length-and-chunked": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    ),
    "obs-fold": b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
    "space-before-colon": b"HTTP/1.1 200 OK\r\nX-Space : 1\r\nContent-Length: 2\r\n\r\nok",
    "bad-content-length": b"HTTP/1.1 200 OK\r\nContent-Length: 2x\r\n\r\nok",
    "truncated-body": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    "garbage": b"NOT HTTP AT ALL\r\n\r\n",
}
"""Whole answers, each sent on its own connection, which the server then closes."""

STRICTER_THAN_H11: dict[str, Verdict] = {
    "duplicate-content-length": "error",  # h11 merges equal values
    "content-length-and-chunked": "error",  # h11 lets chunked win; RFC 9112 6.1 allows refusing
    "obs-fold": "error",  # h11 unfolds; RFC 9112 5.2 allows refusing
}
"""Cases where llhttp refuses what h11 reads (safe: a refusal is a 502 to the client, never a misread)."""


def h11_verdict(data: bytes) -> Verdict:
    """What h11 reads of `data` as the answer to a POST, the server closing after it."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")
    status, headers, body = 0, [], b""
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                status, headers = event.status_code, [(n, v) for n, v in event.headers.raw_items()]
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return status, [(n.lower(), v) for n, v in headers], body
            elif event in (h11.NEED_DATA, h11.PAUSED) or isinstance(event, h11.ConnectionClosed):
                return "error"
    except h11.RemoteProtocolError:
        return "error"


async def transport_verdicts(data: bytes) -> tuple[Verdict, Verdict]:
    """(read whole, read as a stream) by the fast transport, for `data` served on a fresh connection."""

    async def respond(exchange: Exchange) -> bool:
        return await answer(exchange, data, keep_open=False)

    async with serve(respond) as server:
        url = httpx.URL(server.url + "/")
        return await read_whole(url), await read_streamed(url)


def new_client() -> UpstreamClient:
    """A client of its own per read: the server closes each connection after its answer."""
    return UpstreamClient(UpstreamClientConfig(), {"accept-encoding": "identity"})


async def read_whole(url: httpx.URL) -> Verdict:
    client = new_client()
    try:
        whole = await client.post(url, b"", None)
    except httpx.TransportError:
        return "error"
    finally:
        await client.aclose()
    return whole.status_code, [], whole.content


async def read_streamed(url: httpx.URL) -> Verdict:
    client = new_client()
    try:
        async with client.http.stream("POST", url, content=b"") as streamed:
            body = b"".join([part async for part in streamed.aiter_raw()])
    except httpx.TransportError:
        return "error"
    finally:
        await client.aclose()
    headers = [(name.lower(), value) for name, value in streamed.headers.raw]
    return streamed.status_code, headers, body


@pytest.mark.parametrize("case", list(CASES))
async def test_each_answer_reads_as_h11_reads_it(case: str) -> None:
    expected = STRICTER_THAN_H11.get(case, h11_verdict(CASES[case]))
    whole, streamed = await transport_verdicts(CASES[case])
    assert streamed == expected
    assert whole == (expected if isinstance(expected, str) else (expected[0], [], expected[2]))
