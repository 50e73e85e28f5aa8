"""A real gateway (uvicorn on loopback) in front of the embedded engine, for end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from adapters.local import LocalEngineConfig
from proxy.app import create_app
from proxy.routing.from_settings import build_pool
from proxy.settings import Settings
from tests.gateway_server import GatewayServer


@contextmanager
def local_gateway(engine: LocalEngineConfig) -> Iterator[GatewayServer]:
    """Start the gateway with `engine` as its only worker; stop it (and the engine) on exit."""
    settings = Settings(local_engine=engine)
    server = GatewayServer(create_app(settings, router=build_pool(settings))).start()
    try:
        yield server
    finally:
        server.stop()
