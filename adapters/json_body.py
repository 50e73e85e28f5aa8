"""Small edits of a request body (a JSON object) on its way to an engine.

A field is spliced in after the opening brace without re-encoding the body when the body does not
name it yet (the common case); otherwise the body is decoded and re-encoded, so the new value is
the only one and no client value survives under another spelling of the key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

_decoder = msgspec.json.Decoder(dict[str, Any])


def with_field(raw_body: bytes, field: str, value: Any) -> bytes:
    """`raw_body` with `field` set to `value`."""
    key = msgspec.json.encode(field)
    if key not in raw_body:
        start = raw_body.index(b"{") + 1
        separator = b"" if raw_body[start:].lstrip().startswith(b"}") else b","
        return raw_body[:start] + key + b":" + msgspec.json.encode(value) + separator + raw_body[start:]
    body = _decoder.decode(raw_body)
    body[field] = value
    return msgspec.json.encode(body)


def without_fields(raw_body: bytes, fields: Iterable[str]) -> bytes:
    """`raw_body` re-encoded without `fields` (matched on the decoded keys, whatever their escapes)."""
    body = _decoder.decode(raw_body)
    for name in fields:
        body.pop(name, None)
    return msgspec.json.encode(body)
