"""Reading a plain generation request straight from the bytes a connection received.

Most requests a gateway serves are alike: `POST /v1/chat/completions HTTP/1.1`, a dozen headers,
a `Content-Length` JSON body, all of it in one or two reads. `read_plain_request` reads such a
request with `adapters.http_transport.plain_message` instead of httptools' per-field callbacks; it
is plain when that module says so, its request line is a `POST` to one of the given paths in
HTTP/1.1 (no query string), and it has no `Expect` or `Upgrade` field. Anything else is
`NOT_PLAIN`, and the server hands the bytes to httptools as it would have anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Generic, NamedTuple, TypeVar

from adapters.http_transport.plain_message import INCOMPLETE, NOT_PLAIN, PlainHead, Verdict, read_plain_head

__all__ = ["INCOMPLETE", "NOT_PLAIN", "PlainRequest", "read_plain_request", "request_lines"]

Route = TypeVar("Route")

_NOT_PLAIN_FIELDS: Final = frozenset((b"expect", b"upgrade"))


class PlainRequest(NamedTuple, Generic[Route]):
    route: Route
    """What the request line maps to."""
    path: bytes
    headers: list[tuple[bytes, bytes]]
    """Lower-cased names, values without surrounding whitespace, in the order received."""
    body: bytes
    keep_alive: bool
    """False when the client sent `Connection: close`."""


def request_lines(paths: Mapping[bytes, Route]) -> dict[bytes, tuple[bytes, Route]]:
    """The request line of a plain POST to each path (`POST /v1/completions HTTP/1.1`), for
    `read_plain_request`."""
    return {b"POST %s HTTP/1.1" % path: (path, route) for path, route in paths.items()}


def read_plain_request(
    data: bytes, lines: Mapping[bytes, tuple[bytes, Route]]
) -> PlainRequest[Route] | Verdict:
    """`data` as one whole plain request to one of `lines` (see `request_lines`), `INCOMPLETE`
    when it can still become one, or `NOT_PLAIN`."""
    head = read_plain_head(data, _NOT_PLAIN_FIELDS, lower_names=True)
    if not isinstance(head, PlainHead):
        return head
    target = lines.get(head.start_line)
    if target is None:
        return NOT_PLAIN
    return PlainRequest(target[1], target[0], head.headers, data[head.body_start :], head.keep_alive)
