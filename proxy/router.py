"""The contract between the request path and whatever chooses a worker.

The request path asks a `Router` for a `WorkerLease` per attempt; the lease names the
engine to call and must be released exactly once, with what the engine reported, so the
router can track load and correct its prefix trees.
"""

from __future__ import annotations

from typing import Protocol

from adapters.base import Engine, EngineRequest
from adapters.schema import Usage


class WorkerLease(Protocol):
    """One attempt's hold on one worker."""

    worker_id: str
    engine: Engine

    def release(self, *, usage: Usage | None, failed: bool) -> None:
        """End the attempt: drop in-flight load, record failure for health/breakers, and feed
        engine-reported `cached_tokens` back into the routing tree."""
        ...


class Router(Protocol):
    """Chooses a worker for each request of a model."""

    def model_ids(self) -> list[str]:
        """The models this gateway serves, in configuration order."""
        ...

    def has_model(self, model: str) -> bool: ...

    async def acquire(self, request: EngineRequest, *, exclude: frozenset[str] = frozenset()) -> WorkerLease:
        """Pick a worker for `request`, skipping `exclude` (workers that already failed this request).
        Raises `adapters.errors.EngineOverloaded` when no healthy worker is left."""
        ...

    def readiness(self) -> dict[str, bool]:
        """Per model: True when at least one healthy worker serves it."""
        ...

    def component_states(self) -> dict[str, str]:
        """Per worker: "operational", "degraded" or "down", for `GET /health`."""
        ...

    async def start(self) -> None:
        """Start background work (health checks, engine threads)."""
        ...

    async def aclose(self) -> None:
        """Stop background work and close every engine."""
        ...
