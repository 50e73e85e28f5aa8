"""API keys to tenants, and each tenant's cache salt.

Keys are configured as SHA-256 hex digests (`radixgate config hash-key KEY` prints one), so the
configuration never holds a usable key. A presented key is hashed and compared against every
configured digest with `hmac.compare_digest`, so the time taken does not depend on which digest,
or how much of one, matched. The cache salt is HMAC-SHA256(secret, tenant id): the client never
chooses it, and two tenants never share one.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from proxy.errors import ApiError
from proxy.settings import AuthSettings

_BEARER = b"bearer "


@dataclass(slots=True, frozen=True)
class Tenant:
    """Who sent a request; travels with it into `EngineRequest`."""

    id: str
    cache_salt: str


def hash_key(key: str) -> str:
    """The hex SHA-256 of an API key, as `auth.api_keys[].sha256` expects it."""
    return hashlib.sha256(key.encode()).hexdigest()


def cache_salt(secret: str, tenant_id: str) -> str:
    """The tenant's salt for every cache key, tree and engine cache (`EngineRequest.cache_salt`)."""
    return hmac.new(secret.encode(), tenant_id.encode(), hashlib.sha256).hexdigest()


class Authenticator:
    """Resolves the `Authorization` header of a request to its `Tenant`."""

    __slots__ = ("_anonymous", "_keys")

    def __init__(self, settings: AuthSettings) -> None:
        tenants = {entry.tenant for entry in settings.api_keys}
        by_id = {tenant: Tenant(tenant, cache_salt(settings.cache_salt_secret, tenant)) for tenant in tenants}
        self._keys = [(bytes.fromhex(entry.sha256), by_id[entry.tenant]) for entry in settings.api_keys]
        anonymous = settings.anonymous_tenant
        self._anonymous = Tenant(anonymous, cache_salt(settings.cache_salt_secret, anonymous))

    @property
    def required(self) -> bool:
        """True when keys are configured, so every request must present one."""
        return bool(self._keys)

    def authenticate(self, authorization: bytes | None) -> Tenant:
        """The tenant of a raw `Authorization` header value; raises a 401 `ApiError` when keys are
        configured and the header is missing or holds no valid key."""
        if not self._keys:
            return self._anonymous
        if authorization is None or authorization[:7].lower() != _BEARER or not authorization[7:].strip():
            raise _unauthorized("You didn't provide an API key. Send it as `Authorization: Bearer KEY`.")
        digest = hashlib.sha256(authorization[7:].strip()).digest()
        found: Tenant | None = None
        for key_digest, tenant in self._keys:
            if hmac.compare_digest(key_digest, digest):
                found = tenant
        if found is None:
            raise _unauthorized("Incorrect API key provided.")
        return found


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"www-authenticate": "Bearer"})
