"""Putting the gateway's tenant salt into a request body for engines that isolate caches by salt.

vLLM and SGLang accept `cache_salt` on their OpenAI endpoints (SGLang's native `/generate` calls it
`extra_key`): requests with different salts never share prefix-cache blocks. The salt is set by the
gateway from the tenant; a client's own value is dropped by the proxy as soon as the body is decoded
(`without_client_salt`), whichever engine serves the request, and never trusted.
"""

from __future__ import annotations

from adapters.json_body import with_field, without_fields

SALT_FIELDS = ("cache_salt", "extra_key")
"""The request fields that name a cache salt on vLLM's and SGLang's endpoints."""


def without_client_salt(raw_body: bytes) -> bytes:
    """`raw_body` (a JSON object) re-encoded without any salt field the client sent."""
    return without_fields(raw_body, SALT_FIELDS)


def with_cache_salt(raw_body: bytes, salt: str, field: str = "cache_salt") -> bytes:
    """`raw_body` (a JSON object) with `field` set to `salt`; unchanged when `salt` is empty."""
    return with_field(raw_body, field, salt) if salt else raw_body
