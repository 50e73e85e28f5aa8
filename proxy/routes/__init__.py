"""The gateway's HTTP routes, one module per resource."""

from __future__ import annotations

from litestar.handlers import BaseRouteHandler

from proxy.gateway import Gateway
from proxy.pipeline import Pipeline
from proxy.routes.generation import generation_handlers
from proxy.routes.health import health_handlers
from proxy.routes.models import models_handlers
from proxy.routes.usage import usage_handlers


def route_handlers(gateway: Gateway, pipeline: Pipeline) -> list[BaseRouteHandler]:
    """The OpenAI routes and the health probes (the cache's, telemetry's and the admin API's are
    their packages')."""
    return [
        *generation_handlers(pipeline, gateway.settings.server.max_body_bytes),
        *models_handlers(gateway),
        *health_handlers(gateway),
        *usage_handlers(gateway),
    ]
