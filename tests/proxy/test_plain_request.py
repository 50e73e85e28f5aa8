"""`read_plain_request`: a plain POST to a known path, or not."""

from __future__ import annotations

import pytest

from proxy.plain_request import INCOMPLETE, NOT_PLAIN, PlainRequest, read_plain_request, request_lines

LINES = request_lines({b"/v1/chat/completions": "chat", b"/v1/completions": "text"})
BODY = b'{"model":"m"}'


def request(start: bytes, *fields: bytes) -> bytes:
    return b"\r\n".join((start, b"Host: g", b"Content-Length: 13", *fields)) + b"\r\n\r\n" + BODY


def test_a_plain_post_maps_to_its_route() -> None:
    found = read_plain_request(request(b"POST /v1/completions HTTP/1.1", b"Authorization: Bearer k"), LINES)
    assert isinstance(found, PlainRequest)
    assert (found.route, found.path, found.body, found.keep_alive) == ("text", b"/v1/completions", BODY, True)
    assert found.headers == [(b"host", b"g"), (b"content-length", b"13"), (b"authorization", b"Bearer k")]


@pytest.mark.parametrize(
    "start",
    [
        b"GET /v1/completions HTTP/1.1",
        b"POST /v1/models HTTP/1.1",
        b"POST /v1/completions?x=1 HTTP/1.1",
        b"POST /v1/completions HTTP/1.0",
        b"post /v1/completions HTTP/1.1",
    ],
)
def test_other_methods_paths_queries_and_versions_are_not_plain(start: bytes) -> None:
    assert read_plain_request(request(start), LINES) is NOT_PLAIN


@pytest.mark.parametrize(
    "field", [b"Expect: 100-continue", b"Upgrade: websocket", b"Transfer-Encoding: chunked"]
)
def test_expect_upgrade_and_chunked_are_not_plain(field: bytes) -> None:
    assert read_plain_request(request(b"POST /v1/chat/completions HTTP/1.1", field), LINES) is NOT_PLAIN


def test_a_request_without_its_whole_body_is_incomplete() -> None:
    data = request(b"POST /v1/chat/completions HTTP/1.1")
    assert read_plain_request(data[:-3], LINES) is INCOMPLETE
