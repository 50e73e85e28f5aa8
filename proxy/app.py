"""`create_app(settings)`: the Litestar application of one gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar

from proxy import __version__
from proxy.auth import Authenticator
from proxy.cache.layer import CacheLayer
from proxy.errors import EXCEPTION_HANDLERS
from proxy.forwarding import Forwarder, RetryPolicy
from proxy.gateway import Gateway
from proxy.router import Router
from proxy.routes import route_handlers
from proxy.routing.admin import admin_router, key_guard
from proxy.routing.from_settings import build_pool
from proxy.routing.pool import WorkerPool
from proxy.settings import Settings
from proxy.telemetry import Telemetry


def create_app(
    settings: Settings, *, router: Router | None = None, telemetry: Telemetry | None = None
) -> Litestar:
    """The app for `settings`. `router` and `telemetry` replace the ones the settings describe
    (tests inject in-memory exporters or a router over test engines). The app's lifespan starts
    the router's background work and, on shutdown, closes every engine and flushes telemetry."""
    telemetry = telemetry or Telemetry.from_settings(settings.telemetry, service_version=__version__)
    router = router or build_pool(settings, telemetry)
    forwarder = Forwarder(router, telemetry, RetryPolicy.from_settings(settings.routing))
    cache = CacheLayer.from_settings(settings, telemetry.prometheus, router, tracer=telemetry.tracer)
    gateway = Gateway(
        settings, router, forwarder, Authenticator(settings.auth), telemetry, __version__, cache=cache.step
    )

    # The worker admin API exists only over the worker pool (tests may inject another router).
    admin = (
        [admin_router(router, guards=[key_guard(gateway.auth.authenticate)])]
        if isinstance(router, WorkerPool)
        else []
    )

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        try:
            await router.start()
            yield
        finally:
            await router.aclose()
            await telemetry.shutdown()

    app = Litestar(
        route_handlers=[
            *route_handlers(gateway),
            *cache.handlers(gateway),
            telemetry.metrics_handler,
            *admin,
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
