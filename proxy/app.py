"""`create_app(settings)`: the Litestar application of one gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from litestar import Litestar

from proxy import __version__
from proxy.auth import Authenticator, admin_guard
from proxy.cache.admin_routes import admin_handlers
from proxy.cache.cached_routes import cached_handlers
from proxy.cache.layer import CacheLayer
from proxy.errors import EXCEPTION_HANDLERS
from proxy.forwarding import Forwarder, RetryPolicy
from proxy.gateway import Gateway
from proxy.keys import KeyStore
from proxy.ledger import UsageLedger
from proxy.pipeline import Pipeline
from proxy.responses.config import RESPONSES_FILE
from proxy.responses.routes import responses_handlers
from proxy.responses.store import ResponseStore
from proxy.routes import route_handlers
from proxy.routes.keys import keys_router
from proxy.routing.admin import admin_router, allowed_hosts
from proxy.routing.from_settings import build_pool
from proxy.routing.pool import WorkerPool
from proxy.settings import Settings
from proxy.telemetry import Telemetry
from proxy.tenancy import Limiter, TenantLimiter


def create_app(
    settings: Settings, *, router: WorkerPool | None = None, telemetry: Telemetry | None = None
) -> Litestar:
    """The app for `settings`. `router` and `telemetry` replace the ones the settings describe
    (tests inject in-memory exporters or a pool over test engines). The app's lifespan starts
    the router's background work and, on shutdown, closes every engine and flushes telemetry."""
    telemetry = telemetry or Telemetry.from_settings(settings.telemetry, service_version=__version__)
    router = router or build_pool(settings, telemetry)
    forwarder = Forwarder(router, telemetry, RetryPolicy.from_settings(settings.routing))
    cache = CacheLayer.from_settings(settings, telemetry.prometheus, router, tracer=telemetry.tracer)
    ledger = UsageLedger(ledger_path(settings))
    keys = KeyStore(ledger_path(settings))
    responses = ResponseStore(responses_path(settings), settings.responses.ttl_s)
    gateway = Gateway(
        settings,
        router,
        forwarder,
        Authenticator(settings.auth, keys),
        telemetry,
        __version__,
        cache=cache.step,
        limiter=tenant_limiter(settings, ledger),
        ledger=ledger,
    )
    pipeline = Pipeline(gateway)
    auth = settings.auth
    for tenant in {auth.anonymous_tenant, *auth.tenants, *(key.tenant for key in auth.api_keys)}:
        telemetry.gateway_metrics.tenant_known(tenant)
    max_body = settings.server.max_body_bytes

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        try:
            await router.start()
            async with grpc_front_door(settings, gateway, pipeline):
                yield
        finally:
            await router.aclose()
            await gateway.limiter.aclose()
            await asyncio.to_thread(ledger.close)
            keys.close()
            responses.close()
            await telemetry.shutdown()

    app = Litestar(
        route_handlers=[
            *route_handlers(gateway, pipeline),
            *cached_handlers(pipeline, max_body, cache.config.speculative),
            *responses_handlers(gateway, pipeline, responses, max_body),
            *admin_handlers(gateway, cache),
            telemetry.metrics_handler,
            keys_router(gateway),
            admin_router(
                router,
                guards=[admin_guard(gateway.auth)],
                worker_hosts=allowed_hosts(router, settings.routing.allowed_worker_hosts),
            ),
        ],
        middleware=[telemetry.middleware],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=[lifespan, cache.lifespan],
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=None,  # openapi.yaml at the repository root is the published description
        logging_config=None,  # the CLI configures logging once, for uvicorn and the gateway alike
    )
    app.state.gateway = gateway
    return app


def tenant_limiter(settings: Settings, ledger: UsageLedger) -> Limiter:
    """Per-tenant limits in this process, or shared by every replica when Redis is configured."""
    local = TenantLimiter(dict(settings.auth.tenants), ledger)
    if settings.cache.redis_url is None or not settings.auth.tenants:
        return local
    from proxy.tenancy_redis import RedisLimiter

    return RedisLimiter(dict(settings.auth.tenants), settings.cache.redis_url, local)


LEDGER_FILE = "usage.sqlite3"


def ledger_path(settings: Settings) -> Path | None:
    """`auth.ledger_path`, else `usage.sqlite3` in `cache.dir`, else None (in memory)."""
    if settings.auth.ledger_path is not None:
        return Path(settings.auth.ledger_path)
    return Path(settings.cache.dir) / LEDGER_FILE if settings.cache.dir is not None else None


def responses_path(settings: Settings) -> Path | None:
    """`responses.path`, else `responses.sqlite3` in `cache.dir`, else None (in memory)."""
    if settings.responses.path is not None:
        return Path(settings.responses.path)
    return Path(settings.cache.dir) / RESPONSES_FILE if settings.cache.dir is not None else None


@asynccontextmanager
async def grpc_front_door(settings: Settings, gateway: Gateway, pipeline: Pipeline) -> AsyncIterator[None]:
    """The gRPC listener while the app runs, when `server.grpc_port` is set (imported only then:
    see `proxy.grpc`)."""
    server = settings.server
    if server.grpc_port is None:
        yield
        return
    from proxy.grpc.server import GrpcFrontDoor

    front_door = GrpcFrontDoor(
        gateway, pipeline, server.host, server.grpc_port, max_message_bytes=server.max_body_bytes
    )
    await front_door.start()
    try:
        yield
    finally:
        await front_door.stop(server.graceful_shutdown_s)
