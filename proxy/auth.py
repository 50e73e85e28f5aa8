"""API keys to tenants, each tenant's cache salt, and the two scopes: tenant and admin.

Keys are configured as SHA-256 hex digests (`radixgate config hash-key KEY` prints one), so the
configuration never holds a usable key. A presented key is hashed and compared against every
configured digest with `hmac.compare_digest`, so the time taken does not depend on which digest,
or how much of one, matched. The cache salt is HMAC-SHA256(secret, tenant id): the client never
chooses it, and two tenants never share one.

A key is a tenant key unless configured `admin = true`. The admin API (`/admin/*`) and the cache's
`POST /v1/cache/clear|warm` need an admin key (`admin_guard`): a tenant key gets 403
`permission_denied`, no key 401. With no keys configured at all, they answer loopback clients only,
so a gateway bound to a public address without keys cannot be administered from outside.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from proxy.errors import ApiError
from proxy.keys import KeyStore
from proxy.settings import AuthSettings

_BEARER = b"bearer "


@dataclass(slots=True, frozen=True)
class Tenant:
    """Who sent a request; travels with it into `EngineRequest`."""

    id: str
    cache_salt: str
    admin: bool = False
    """The key that identified this caller may administer the gateway."""


def hash_key(key: str) -> str:
    """The hex SHA-256 of an API key, as `auth.api_keys[].sha256` expects it."""
    return hashlib.sha256(key.encode()).hexdigest()


def cache_salt(secret: str, tenant_id: str) -> str:
    """The tenant's salt for every cache key, tree and engine cache (`EngineRequest.cache_salt`)."""
    return hmac.new(secret.encode(), tenant_id.encode(), hashlib.sha256).hexdigest()


class Authenticator:
    """Resolves the `Authorization` header of a request to its `Tenant`."""

    __slots__ = ("_anonymous", "_keys", "_secret", "runtime")

    def __init__(self, settings: AuthSettings, runtime: KeyStore | None = None) -> None:
        secret = self._secret = settings.cache_salt_secret
        self.runtime = runtime if runtime is not None else KeyStore(None)
        """Keys created at run time (`POST /admin/keys`), beside the configured ones."""
        self._keys = [
            (bytes.fromhex(entry.sha256), Tenant(entry.tenant, cache_salt(secret, entry.tenant), entry.admin))
            for entry in settings.api_keys
        ]
        anonymous = settings.anonymous_tenant
        self._anonymous = Tenant(anonymous, cache_salt(settings.cache_salt_secret, anonymous))

    @property
    def required(self) -> bool:
        """True when keys are configured or created, so every request must present one."""
        return bool(self._keys) or bool(self.runtime)

    def authenticate(self, authorization: bytes | None) -> Tenant:
        """The tenant of a raw `Authorization` header value; raises a 401 `ApiError` when keys are
        configured and the header is missing or holds no valid key."""
        if not self.required:
            return self._anonymous
        if authorization is None or authorization[:7].lower() != _BEARER or not authorization[7:].strip():
            raise _unauthorized("You didn't provide an API key. Send it as `Authorization: Bearer KEY`.")
        digest = hashlib.sha256(authorization[7:].strip()).digest()
        found: Tenant | None = None
        for key_digest, tenant in self._keys:
            if hmac.compare_digest(key_digest, digest):
                found = tenant
        if found is None and (stored := self.runtime.find(digest)) is not None:
            found = Tenant(stored.tenant, cache_salt(self._secret, stored.tenant), stored.admin)
        if found is None:
            raise _unauthorized("Incorrect API key provided.")
        return found

    def authorize_admin(self, authorization: bytes | None, client_host: str | None) -> Tenant:
        """The caller, when it may administer the gateway: an admin key, or, with no keys configured,
        a loopback client. 401 without a valid key, 403 `permission_denied` otherwise."""
        if not self.required:
            if client_host is not None and is_loopback(client_host):
                return self._anonymous
            raise _forbidden("The admin API answers only loopback clients while no API keys are configured.")
        tenant = self.authenticate(authorization)
        if not tenant.admin:
            raise _forbidden("This API key may not administer the gateway; use a key with `admin = true`.")
        return tenant


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tenant_guard(auth: Authenticator) -> Guard:
    """A Litestar guard: any valid key (everyone when none are configured); the caller's tenant is
    left in `state.tenant`, so a handler that needs it does not authenticate again."""

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        connection.state.tenant = auth.authenticate(_authorization(connection))

    return guard


def admin_guard(auth: Authenticator) -> Guard:
    """A Litestar guard: the admin scope (`Authenticator.authorize_admin`); the caller in `state.tenant`."""

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        client = connection.client.host if connection.client is not None else None
        connection.state.tenant = auth.authorize_admin(_authorization(connection), client)

    return guard


def _authorization(connection: ASGIConnection[Any, Any, Any, Any]) -> bytes | None:
    values = connection.headers.getall("authorization", [])
    if len(values) > 1:
        raise ApiError.duplicate_header("Authorization")
    return values[0].encode("latin-1") if values else None


def _forbidden(message: str) -> ApiError:
    return ApiError(403, message, error_type="permission_error", code="permission_denied")


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"www-authenticate": "Bearer"})
