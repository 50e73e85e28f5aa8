"""Putting the gateway's tenant salt into a request body for engines that isolate caches by salt.

vLLM and SGLang accept `cache_salt` on their OpenAI endpoints (SGLang's native `/generate` calls it
`extra_key`): requests with different salts never share prefix-cache blocks. The salt is set by the
gateway from the tenant; a client's own value is dropped by the proxy as soon as the body is decoded
(`without_client_salt`), whichever engine serves the request, and never trusted.
"""

from __future__ import annotations

from typing import Any

import msgspec

_decoder = msgspec.json.Decoder(dict[str, Any])
SALT_FIELDS = ("cache_salt", "extra_key")
"""The request fields that name a cache salt on vLLM's and SGLang's endpoints."""


def without_client_salt(raw_body: bytes) -> bytes:
    """`raw_body` (a JSON object) re-encoded without any salt field the client sent."""
    body = _decoder.decode(raw_body)
    for name in SALT_FIELDS:
        body.pop(name, None)
    return msgspec.json.encode(body)


def with_cache_salt(raw_body: bytes, salt: str, field: str = "cache_salt") -> bytes:
    """`raw_body` (a JSON object) with `field` set to `salt`; unchanged when `salt` is empty.

    `raw_body` holds no client salt (`without_client_salt` ran at decode), so the field is spliced in
    after the opening brace without re-encoding the body; a body that names the field anyway (a
    caller other than the proxy) is decoded and rewritten, so the gateway's value is the only one.
    """
    if not salt:
        return raw_body
    key = msgspec.json.encode(field)
    if key not in raw_body:
        start = raw_body.index(b"{") + 1
        rest = raw_body[start:].lstrip()
        separator = b"" if rest.startswith(b"}") else b","
        return raw_body[:start] + key + b":" + msgspec.json.encode(salt) + separator + raw_body[start:]
    body = _decoder.decode(raw_body)
    body[field] = salt
    return msgspec.json.encode(body)
