"""Response bodies the gateway writes itself (generation bodies come from the engines)."""

from __future__ import annotations

from typing import Literal

import msgspec


class ModelCard(msgspec.Struct, kw_only=True):
    """One entry of `GET /v1/models`, as OpenAI lists a model."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class HealthDetails(msgspec.Struct, kw_only=True):
    memory_usage_bytes: int
    """Resident memory of the gateway process."""
    active_requests: int
    """Generation requests in flight."""
    components: dict[str, str]
    """`inference_runtime`, `model_registry` and `cache_system` (the seed's), then each worker by id:
    "operational", "degraded" or "down" ("disabled" for a cache that is off)."""


class HealthStatus(msgspec.Struct, kw_only=True):
    """`GET /health`, in the shape of the seed's health document."""

    status: Literal["healthy", "degraded", "unhealthy"]
    timestamp: str
    """RFC 3339 UTC time of the check, e.g. `2025-08-23T10:30:00Z`."""
    version: str
    uptime_seconds: int
    details: HealthDetails


class ReadyStatus(msgspec.Struct, kw_only=True):
    """`GET /health/ready` when every model has a healthy worker."""

    status: Literal["ready"] = "ready"
    models: dict[str, bool]


class LiveStatus(msgspec.Struct, kw_only=True):
    status: Literal["alive"] = "alive"
