"""`GET /health` (the seed's health document), `/health/ready` and `/health/live` (probes)."""

from __future__ import annotations

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
    @get(HEALTH_PATH, sync_to_thread=False, name="health")
    def health() -> HealthStatus:
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
                components=gateway.router.component_states(),
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
