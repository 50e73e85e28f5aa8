"""Reading a plain HTTP/1.1 message straight from the bytes a connection received.

Most messages the gateway reads are alike: a start line, a dozen header fields, a `Content-Length`
body, all of it in one or two reads. `read_plain_head` reads such a message with a few bytes
operations (find, split, partition, translate) instead of httptools' per-field callbacks into
Python. At a low request rate each request runs on cold caches after an idle wake, and its CPU time
follows the code and objects it touches (`benchmarks/RESULTS.md`, "## overhead"): fewer callbacks,
fewer touched. The server reads requests this way (`proxy.plain_request`), the upstream client
answers (`adapters.http_transport.connection`).

It accepts only what it can read exactly. Anything else gives `NOT_PLAIN`, and the caller hands the
bytes to httptools as it would have anyway: chunked bodies (`Transfer-Encoding`), the fields the
caller names, `Connection: upgrade`, obsolete line folding, whitespace in or after a field name, a
malformed or repeated `Content-Length`, a bare CR or LF, a control byte other than HTAB, bytes after
the body (a pipelined message). A message that is plain so far but not yet whole gives
`INCOMPLETE`, up to `MAX_PLAIN_BYTES`. Field names are not otherwise checked against RFC 9110's
`token`: callers read the few fields they know by name.
"""

from __future__ import annotations

from typing import Final, NamedTuple

MAX_PLAIN_BYTES: Final = 1 << 20
"""Messages larger than this (head and body) are left to httptools, which streams the body."""
_HEAD_END: Final = b"\r\n\r\n"
_HEAD_FORBIDDEN: Final = bytes(range(0x09)) + bytes(range(0x0B, 0x0D)) + bytes(range(0x0E, 0x20)) + b"\x7f"
"""Control bytes other than HTAB, CR and LF: in no message head (CR and LF only as line ends)."""
_OWS: Final = b" \t"


class Verdict:
    """Why `read_plain_head` gave no message."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NOT_PLAIN: Final = Verdict("NOT_PLAIN")
INCOMPLETE: Final = Verdict("INCOMPLETE")


class PlainHead(NamedTuple):
    start_line: bytes
    headers: list[tuple[bytes, bytes]]
    """Values without surrounding whitespace; names lower-cased or as received (`lower_names`)."""
    body_start: int
    """Where the body starts in the bytes read; it runs to their end (its length is `Content-Length`)."""
    keep_alive: bool
    """False when the peer sent `Connection: close`."""


def read_plain_head(
    data: bytes, not_plain_fields: frozenset[bytes], *, lower_names: bool
) -> PlainHead | Verdict:
    """`data` as one whole plain message (see the module docstring), `INCOMPLETE` when it can still
    become one, or `NOT_PLAIN`. `not_plain_fields` (lower-case) are fields that make a message not
    plain besides `Transfer-Encoding`."""
    end = data.find(_HEAD_END)
    if end < 0:
        return INCOMPLETE if len(data) < MAX_PLAIN_BYTES and data.find(b"\n\n") < 0 else NOT_PLAIN
    block = data[:end]
    lines = block.split(b"\r\n")
    breaks = len(lines) - 1
    if (
        block.count(b"\r") != breaks
        or block.count(b"\n") != breaks
        or block.translate(None, _HEAD_FORBIDDEN) != block
    ):
        return NOT_PLAIN
    headers = []
    length = -1
    keep_alive = True
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        # `find`, not `in`: `bytes in bytes` first tries the needle as an int and formats a TypeError.
        if not colon or not name or name.find(b" ") >= 0 or name.find(b"\t") >= 0:
            return NOT_PLAIN  # also a folded line, which starts with whitespace
        value = value.strip(_OWS)
        lower = name.lower()
        if lower == b"content-length":
            if length >= 0 or not value.isdigit():
                return NOT_PLAIN
            length = int(value)
        elif lower == b"connection":
            tokens = [token.strip(_OWS) for token in value.lower().split(b",")]
            if b"upgrade" in tokens:
                return NOT_PLAIN
            keep_alive = b"close" not in tokens
        elif lower == b"transfer-encoding" or lower in not_plain_fields:
            return NOT_PLAIN
        headers.append((lower if lower_names else name, value))
    if length < 0:
        return NOT_PLAIN
    size = end + 4 + length
    if len(data) != size:
        return INCOMPLETE if len(data) < size <= MAX_PLAIN_BYTES else NOT_PLAIN
    return PlainHead(lines[0], headers, end + 4, keep_alive)
