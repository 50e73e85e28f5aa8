"""`POST /admin/keys`, `GET /admin/keys`, `DELETE /admin/keys/{id}`: API keys at run time (admin scope).

POST   /admin/keys          {"tenant": "acme", "admin": false} -> 201 with the key, shown this once
GET    /admin/keys          every run-time key (ids, tenants, scopes; never the keys)
DELETE /admin/keys/{id}     revoke it; 404 when no live key has that id
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Router, delete, get, post
from litestar.params import FromPath

from proxy.auth import admin_guard
from proxy.errors import ApiError
from proxy.gateway import Gateway
from proxy.keys import StoredKey
from proxy.routes.options import options_handler

TENANT_PATTERN = r"^[A-Za-z0-9._@:-]{1,128}$"


class NewKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tenant: Annotated[str, msgspec.Meta(pattern=TENANT_PATTERN)]
    """The tenant the key belongs to; its usage, limits and cache salt are that tenant's."""
    admin: bool = False
    """True: the key may administer the gateway."""


class KeyInfo(msgspec.Struct, kw_only=True):
    id: str
    tenant: str
    admin: bool
    created_at: float


class CreatedKey(KeyInfo, kw_only=True):
    key: str
    """The key itself: shown in this answer only, stored as its SHA-256."""


class KeyList(msgspec.Struct, kw_only=True):
    keys: list[KeyInfo]


class RevokedKey(msgspec.Struct, kw_only=True):
    id: str
    revoked: bool = True


def _info(stored: StoredKey) -> KeyInfo:
    return KeyInfo(id=stored.id, tenant=stored.tenant, admin=stored.admin, created_at=stored.created_at)


def keys_router(gateway: Gateway) -> Router:
    store = gateway.auth.runtime

    @post("/keys", status_code=201)
    async def create_key(request: Request[Any, Any, Any]) -> CreatedKey:
        # Decoded here, strictly: Litestar's own decoding would take `"admin": 0` for false.
        try:
            data = msgspec.json.decode(await request.body(), type=NewKey)
        except msgspec.ValidationError as exc:
            raise ApiError.invalid_body(exc) from None
        except msgspec.DecodeError as exc:
            raise ApiError.invalid_json(str(exc)) from None
        stored, key = store.create(data.tenant, data.admin)
        return CreatedKey(**msgspec.structs.asdict(_info(stored)), key=key)

    @get("/keys", sync_to_thread=False)
    def list_keys() -> KeyList:
        return KeyList(keys=[_info(stored) for stored in store.live()])

    @delete("/keys/{key_id:str}", status_code=200, sync_to_thread=False)
    def revoke_key(key_id: FromPath[str]) -> RevokedKey:
        if not store.revoke(key_id):
            raise ApiError(404, f"No API key `{key_id}`.", param="id", code="key_not_found")
        return RevokedKey(id=key_id)

    return Router(
        path="/admin",
        # The OPTIONS handler first: registered after the others, Litestar's automatic one would win.
        route_handlers=[options_handler("/keys", ("GET", "POST")), create_key, list_keys, revoke_key],
        guards=[admin_guard(gateway.auth)],
    )
