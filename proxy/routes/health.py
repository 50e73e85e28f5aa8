"""`GET /health` (the seed's health document), `/health/ready` and `/health/live` (probes)."""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import time
from datetime import UTC, datetime
from typing import Literal

from litestar import get
from litestar.handlers import HTTPRouteHandler

from proxy.errors import ApiError
from proxy.gateway import Gateway
from proxy.schemas import HealthDetails, HealthStatus, LiveStatus, ReadyStatus

HEALTH_PATH = "/health"
READY_PATH = "/health/ready"
LIVE_PATH = "/health/live"


def health_handlers(gateway: Gateway) -> list[HTTPRouteHandler]:
    @get(HEALTH_PATH, name="health")
    async def health() -> HealthStatus:
        readiness = gateway.router.readiness()
        ready = sum(readiness.values())
        status: Literal["healthy", "degraded", "unhealthy"]
        if readiness and ready == len(readiness):
            status = "healthy"
        elif ready:
            status = "degraded"
        else:
            status = "unhealthy"
        return HealthStatus(
            status=status,
            timestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            version=gateway.version,
            uptime_seconds=int(time.monotonic() - gateway.started_at),
            details=HealthDetails(
                memory_usage_bytes=resident_memory_bytes(),
                active_requests=gateway.active_requests,
                components=await components(gateway, readiness),
            ),
        )

    @get(READY_PATH, sync_to_thread=False, name="health_ready")
    def ready() -> ReadyStatus:
        readiness = gateway.router.readiness()
        waiting = [model for model, ok in readiness.items() if not ok]
        if not readiness or waiting:
            reason = f"no healthy worker for {', '.join(waiting)}" if waiting else "no model is known yet"
            raise ApiError(503, f"Not ready: {reason}.", error_type="service_unavailable", code="not_ready")
        return ReadyStatus(models=readiness)

    @get(LIVE_PATH, sync_to_thread=False, name="health_live")
    def live() -> LiveStatus:
        return LiveStatus()

    return [health, ready, live]


def resident_memory_bytes() -> int:
    """Resident set size now (Linux), else the peak that `getrusage` reports."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


ComponentState = Literal["operational", "degraded", "down", "disabled"]


async def components(gateway: Gateway, readiness: dict[str, bool]) -> dict[str, str]:
    """The seed's three components, then every worker by id.

    - `inference_runtime`: the workers: operational when all are, down when none is up.
    - `model_registry`: the models served: operational when each has a ready worker, down when none has.
    - `cache_system`: the response cache's store: degraded once a tier has failed calls or corrupt
      entries (see the alerts of `/v1/cache/stats`), disabled when the response cache is off.
    """
    workers = gateway.router.component_states()
    states: dict[str, str] = {
        "inference_runtime": _overall(list(workers.values())),
        "model_registry": _overall(["operational" if ok else "down" for ok in readiness.values()]),
        "cache_system": await _cache_state(gateway),
    }
    return {**states, **workers}


def _overall(states: list[str]) -> ComponentState:
    if states and all(state == "operational" for state in states):
        return "operational"
    if any(state != "down" for state in states):
        return "degraded"
    return "down"


async def _cache_state(gateway: Gateway) -> ComponentState:
    responses = gateway.cache.cache
    if responses is None:
        return "disabled"
    # The store's lock may be held by disk or Redis I/O: read its counters off the loop then.
    snapshot = await asyncio.to_thread(responses.stats) if responses.blocking else responses.stats()
    return "degraded" if any(tier.errors for tier in snapshot.tiers) else "operational"
