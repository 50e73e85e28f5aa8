"""Cache management: `GET /v1/cache/stats`, `POST /v1/cache/clear`, `POST /v1/cache/warm`.

`stats` takes any valid API key (everyone when no keys are configured); `clear` and `warm` are in the
admin scope (`proxy.auth.admin_guard`), like the worker admin API. `warm` fills the cache for the
admin key's own tenant. `clear` empties every tier of the response cache (every tenant's entries),
every routing tree, and the prefix cache of every engine whose adapter can flush it (SGLang
`/flush_cache`, vLLM `/reset_prefix_cache`); engines that cannot are listed with `flushed: null`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler

from adapters.engine_metrics import FlushesCache
from proxy.auth import Tenant, admin_guard, tenant_guard
from proxy.cache.layer import CacheLayer
from proxy.cache.stats import CacheStatsResponse, build_stats
from proxy.cache.warm import WarmRequest, WarmResult, warm
from proxy.errors import ApiError, split_validation_error
from proxy.gateway import Gateway

CACHE_STATS_PATH = "/v1/cache/stats"
CACHE_CLEAR_PATH = "/v1/cache/clear"
CACHE_WARM_PATH = "/v1/cache/warm"


class EngineFlush(msgspec.Struct, kw_only=True):
    worker: str
    flushed: bool | None
    """True when the engine dropped its prefix cache, False when it refused (e.g. busy), null when
    its adapter has no way to flush it."""


class TierEntries(msgspec.Struct, kw_only=True):
    tier: str
    entries: int | None
    """Entries the tier held before it was emptied (null for Redis, which does not count them)."""


class ClearResult(msgspec.Struct, kw_only=True):
    """The body of `POST /v1/cache/clear`."""

    cleared: bool = True
    response_cache: list[TierEntries]
    """Every tier of the response cache, emptied (an entry may sit in several tiers at once)."""
    routing_trees_cleared: int
    engines: list[EngineFlush]


def admin_handlers(gateway: Gateway, layer: CacheLayer) -> list[HTTPRouteHandler]:
    """The three cache management routes over `layer`."""
    tenants = [tenant_guard(gateway.auth)]
    admins = [admin_guard(gateway.auth)]

    @get(CACHE_STATS_PATH, guards=tenants, name="cache_stats")
    async def cache_stats(request: Request[Any, Any, Any]) -> CacheStatsResponse:
        caller: Tenant = request.state.tenant  # set by the guard
        # A tenant key sees its own tenant's counters; admins (and, without keys, everyone) all of them.
        own = gateway.auth.required and not caller.admin
        return build_stats(
            layer.config,
            layer.settings.preset,
            await layer.store_stats_async(),
            layer.monitor,
            gateway.router,
            layer.step.admission_for(caller.id) if own else layer.step.admission,
            layer.alerts,
            enabled=layer.responses is not None,
            shared=layer.settings.share_across_tenants,
            warming=layer.warmer.progress if layer.warmer is not None else None,
            tenant=layer.monitor.tenant(caller.id) if own else None,
        )

    @post(CACHE_CLEAR_PATH, guards=admins, status_code=200, name="cache_clear")
    async def cache_clear() -> ClearResult:
        removed: list[TierEntries] = []
        snapshot = await layer.store_stats_async()
        if layer.responses is not None and snapshot is not None:
            removed = [TierEntries(tier=t.name, entries=t.entries) for t in snapshot.tiers]
            await asyncio.to_thread(layer.responses.clear)
        router = gateway.router
        workers = router.workers()
        flushed = await router.flush_caches()
        engines = [
            EngineFlush(
                worker=w.id, flushed=flushed.get(w.id, False) if isinstance(w.engine, FlushesCache) else None
            )
            for w in workers
        ]
        return ClearResult(response_cache=removed, routing_trees_cleared=len(workers), engines=engines)

    @post(CACHE_WARM_PATH, guards=admins, status_code=200, name="cache_warm")
    async def cache_warm(request: Request[Any, Any, Any]) -> WarmResult:
        tenant: Tenant = request.state.tenant  # set by the admin guard
        return await warm(gateway, tenant, decode_warm_request(await request.body()))

    return [cache_stats, cache_clear, cache_warm]


_warm_decoder = msgspec.json.Decoder(WarmRequest)


def decode_warm_request(raw: bytes) -> WarmRequest:
    """The body of `POST /v1/cache/warm`; an OpenAI-shaped 400 that says what is wrong otherwise."""
    if not raw.strip():
        raise ApiError(
            400,
            "The request body is empty: send a JSON object with `requests` (whole chat or completion "
            "bodies) and/or `prompts` with `model`.",
            param="requests",
            code="missing_body",
        )
    try:
        return _warm_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        message, path = split_validation_error(str(exc))
        raise ApiError(400, f"Invalid warm request: {message}", param=path) from None
    except msgspec.DecodeError:
        raise ApiError(400, "The request body is not valid JSON.", code="invalid_json") from None
