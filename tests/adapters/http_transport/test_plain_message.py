"""`read_plain_head`: what it reads itself, what it waits for, and what it leaves to httptools."""

from __future__ import annotations

import pytest

from adapters.http_transport.plain_message import (
    INCOMPLETE,
    MAX_PLAIN_BYTES,
    NOT_PLAIN,
    PlainHead,
    read_plain_head,
)

BODY = b'{"model":"m"}'
NONE: frozenset[bytes] = frozenset()


def message(*fields: bytes, body: bytes = BODY, start: bytes = b"HTTP/1.1 200 OK") -> bytes:
    return b"\r\n".join((start, *fields)) + b"\r\n\r\n" + body


def length(body: bytes = BODY) -> bytes:
    return b"Content-Length: %d" % len(body)


def test_a_whole_message_is_read_with_its_fields_and_body() -> None:
    data = message(b"Server:  stub \t", length(), b"X-Empty:")
    head = read_plain_head(data, NONE, lower_names=False)
    assert isinstance(head, PlainHead)
    assert head.start_line == b"HTTP/1.1 200 OK"
    assert head.headers == [(b"Server", b"stub"), (b"Content-Length", b"13"), (b"X-Empty", b"")]
    assert data[head.body_start :] == BODY
    assert head.keep_alive
    lowered = read_plain_head(data, NONE, lower_names=True)
    assert isinstance(lowered, PlainHead)
    assert [name for name, _ in lowered.headers] == [b"server", b"content-length", b"x-empty"]


def test_connection_close_and_an_empty_body() -> None:
    head = read_plain_head(
        message(b"Connection: keep-alive, Close", b"content-length: 0", body=b""), NONE, lower_names=True
    )
    assert isinstance(head, PlainHead)
    assert not head.keep_alive


@pytest.mark.parametrize("cut", [1, 20, 30, -1])
def test_a_message_cut_anywhere_is_incomplete(cut: int) -> None:
    data = message(length())
    assert read_plain_head(data[:cut], NONE, lower_names=True) is INCOMPLETE


@pytest.mark.parametrize(
    "data",
    [
        message(b"Transfer-Encoding: chunked", body=b"0\r\n\r\n"),
        message(b"content-length: 13", b"content-length: 13"),
        message(b"content-length: +13"),
        message(b"content-length: 0x1"),
        message(b"X-A: 1"),  # no length: read to EOF, httptools' business
        message(length(), body=BODY + b"GET / HTTP/1.1\r\n\r\n"),  # a pipelined message behind
        message(length(), b" folded"),
        message(length(), b"X-A : 1"),
        message(length(), b"X A: 1"),
        message(length(), b"no colon"),
        message(length(), b"X-A: a\rb"),
        message(length(), b"X-A: a\nb"),
        message(length(), b"X-A: a\x00b"),
        message(length(), b"X-A: a\x7fb"),
        message(length(), b"Connection: Upgrade"),
        b"HTTP/1.1 200 OK\ncontent-length: 0\n\n",
        message(length(b"x" * MAX_PLAIN_BYTES), body=b""),
    ],
    ids=[
        "chunked",
        "two-lengths",
        "signed-length",
        "hex-length",
        "no-length",
        "pipelined",
        "obs-fold",
        "space-before-colon",
        "space-in-name",
        "no-colon",
        "bare-cr",
        "bare-lf",
        "nul",
        "del",
        "upgrade",
        "lf-only",
        "too-large",
    ],
)
def test_anything_unusual_is_left_to_httptools(data: bytes) -> None:
    assert read_plain_head(data, NONE, lower_names=True) is NOT_PLAIN


def test_fields_the_caller_names_make_a_message_not_plain() -> None:
    data = message(length(), b"Expect: 100-continue")
    assert isinstance(read_plain_head(data, NONE, lower_names=True), PlainHead)
    assert read_plain_head(data, frozenset({b"expect"}), lower_names=True) is NOT_PLAIN


def test_tab_and_obs_text_are_allowed_in_values() -> None:
    head = read_plain_head(message(length(), b"X-A: a\tb\xe9"), NONE, lower_names=True)
    assert isinstance(head, PlainHead)
    assert head.headers[-1] == (b"x-a", b"a\tb\xe9")
