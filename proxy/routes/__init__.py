"""The gateway's HTTP routes, one module per resource."""

from __future__ import annotations

from litestar.handlers import BaseRouteHandler

from proxy.gateway import Gateway
from proxy.routes.generation import generation_handlers
from proxy.routes.health import health_handlers
from proxy.routes.models import models_handlers


def route_handlers(gateway: Gateway) -> list[BaseRouteHandler]:
    """Every route of the app except `/metrics` (telemetry's)."""
    return [*generation_handlers(gateway), *models_handlers(gateway), *health_handlers(gateway)]
