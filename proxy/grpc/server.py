"""`GrpcFrontDoor`: the `grpc.aio` server of one gateway, on the gateway's own event loop.

    front_door = GrpcFrontDoor(gateway, pipeline, host, port)
    await front_door.start()      # in the app's lifespan, beside HTTP
    await front_door.stop(grace)

Beside `inference.GRPCInferenceService` it serves the standard health checking service
(`grpc.health.v1.Health`), whose statuses follow the router's readiness: the server ("") and the
inference service are SERVING when every model has a healthy worker, and each model id is a service
of its own; and server reflection, so `grpcurl` and similar tools need no proto file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from proxy.gateway import Gateway
from proxy.grpc.methods import inference_handler
from proxy.grpc.protocol import grpc_service_pb2 as pb
from proxy.grpc.servicer import InferenceServicer
from proxy.grpc.tracing import SERVICE
from proxy.pipeline import Pipeline

logger = logging.getLogger("radixgate.grpc")

DEFAULT_HEALTH_REFRESH_S: Final = 1.0
"""How often the health statuses are set from the router's readiness (what `Watch` callers see)."""

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class GrpcFrontDoor:
    """The gRPC listener; `port` is the bound one after `start` (the configured 0 picks a free one)."""

    def __init__(
        self, gateway: Gateway, pipeline: Pipeline, host: str, port: int, *, max_message_bytes: int
    ) -> None:
        self._gateway = gateway
        self._address = f"{host}:{port}"
        self._health = health.aio.HealthServicer()
        self._refresher: asyncio.Task[None] | None = None
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),  # a second gateway on the same port must fail, not share it
        ]
        self._server: Any = grpc.aio.server(options=options)
        self._server.add_generic_rpc_handlers((inference_handler(InferenceServicer(gateway, pipeline)),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        services = (
            pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(services, self._server)
        self.port = port

    async def start(self) -> None:
        """Bind and serve; raises `RuntimeError` when the address cannot be bound."""
        try:
            self.port = self._server.add_insecure_port(self._address)
        except RuntimeError as exc:
            raise RuntimeError(f"gRPC: cannot listen on {self._address}: {exc}") from None
        await self._server.start()
        await self._refresh()
        self._refresher = asyncio.create_task(self._refresh_forever(), name="grpc-health")
        logger.info("gRPC (KServe v2 inference protocol) on port %d", self.port)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting calls; those in flight get `grace_s` seconds, then are cancelled."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(DEFAULT_HEALTH_REFRESH_S)
            await self._refresh()

    async def _refresh(self) -> None:
        readiness = self._gateway.router.readiness()
        ready = bool(readiness) and all(readiness.values())
        for service in ("", SERVICE):
            await self._health.set(service, _SERVING if ready else _NOT_SERVING)
        for model, model_ready in readiness.items():
            await self._health.set(model, _SERVING if model_ready else _NOT_SERVING)
