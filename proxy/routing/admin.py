"""The worker admin API: list, add and remove workers while the gateway runs.

    GET    /admin/workers          every worker: health, circuit, load, tree size, tokenizer
    POST   /admin/workers          add one (a `WorkerSpec` body); 201, or 409 if the id is taken
    DELETE /admin/workers/{id}     stop routing to it; 200 when removed at once, 202 while draining

The app mounts `admin_router(pool)`; guards (e.g. an admin-key check) come from the app.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from litestar import Response, Router, delete, get, post
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.params import FromPath, JSONBody
from litestar.types import Guard

from proxy.errors import ApiError
from proxy.routing.config import WorkerSpec
from proxy.routing.pool import WorkerPool
from proxy.routing.worker import Worker


class WorkerStatus(msgspec.Struct, kw_only=True):
    """One worker as `GET /admin/workers` shows it."""

    id: str
    kind: str
    url: str
    models: list[str]
    weight: float
    max_concurrency: int | None
    health: str
    """"up", "down" or "unknown" (not checked yet)."""
    circuit: str
    """"closed", "open" or "half_open"."""
    draining: bool
    in_flight: int
    queued_work_tokens: float
    requests: int
    failures: int
    tree_tokens: int
    tree_nodes: int
    tree_memory_bytes: int
    capacity_tokens: int
    capacity_source: str
    """"config", "engine" (reported by the engine) or "default"."""
    capacity_estimate_tokens: int
    """The tree's size limit after corrections from engine-reported cached tokens."""
    predicted_cached_tokens: int
    reported_cached_tokens: int
    mispredictions: int
    tokenizers: dict[str, str]
    """Per model the worker serves: "tokenizer.json", "gguf", "engine" or "bytes" (the UTF-8 fallback)."""
    engine_load: dict[str, float]


class WorkerList(msgspec.Struct, kw_only=True):
    policy: str
    workers: list[WorkerStatus]


class RemovedWorker(msgspec.Struct, kw_only=True):
    id: str
    state: str
    """"removed", or "draining" while in-flight requests finish."""
    in_flight: int


def worker_status(pool: WorkerPool, worker: Worker) -> WorkerStatus:
    """The admin view of one worker."""
    spec = worker.spec
    models = worker.models or pool.model_ids()
    return WorkerStatus(
        id=worker.id,
        kind=spec.kind,
        url=spec.url,
        models=list(worker.models),
        weight=spec.weight,
        max_concurrency=spec.max_concurrency,
        health=worker.health,
        circuit=worker.breaker.state,
        draining=worker.draining,
        in_flight=worker.in_flight,
        queued_work_tokens=worker.queued_work,
        requests=worker.requests,
        failures=worker.failures,
        tree_tokens=worker.tree.total_tokens,
        tree_nodes=worker.tree.node_count,
        tree_memory_bytes=worker.tree_memory_bytes(),
        capacity_tokens=worker.capacity_tokens,
        capacity_source=worker.capacity_source,
        capacity_estimate_tokens=int(worker.capacity_estimate),
        predicted_cached_tokens=worker.predicted_tokens,
        reported_cached_tokens=worker.reported_cached_tokens,
        mispredictions=worker.mispredictions,
        tokenizers=pool.prompts.kinds(models),
        engine_load=dict(worker.engine_load),
    )


def key_guard(authenticate: Callable[[bytes | None], object]) -> Guard:
    """A guard that lets through only requests the gateway's authenticator accepts (any valid key,
    or everyone when no keys are configured); the caller's tenant is left in `state.tenant`, so a
    handler that needs it does not authenticate again."""

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        header = connection.headers.get("authorization")
        connection.state.tenant = authenticate(header.encode() if header is not None else None)

    return guard


def admin_router(pool: WorkerPool, *, guards: Sequence[Guard] = ()) -> Router:
    """A Litestar router serving the worker admin API over `pool`."""

    @get("/workers", sync_to_thread=False)
    def list_workers() -> WorkerList:
        return WorkerList(policy=pool.policy.name, workers=[worker_status(pool, w) for w in pool.workers()])

    @post("/workers", status_code=201)
    async def add_worker(data: JSONBody[WorkerSpec]) -> WorkerStatus:
        try:
            worker = await pool.add_worker(data)
        except ValueError as exc:
            status = 409 if "already in the pool" in str(exc) else 400
            raise ApiError(
                status, str(exc), param="id" if status == 409 else None, code="invalid_worker"
            ) from exc
        return worker_status(pool, worker)

    @delete("/workers/{worker_id:str}", status_code=200)
    async def remove_worker(worker_id: FromPath[str]) -> Response[RemovedWorker]:
        try:
            result = pool.remove_worker(worker_id)
        except KeyError as exc:
            raise ApiError(
                404, f"No worker `{worker_id}` in the pool.", param="id", code="worker_not_found"
            ) from exc
        body = RemovedWorker(id=result.worker_id, state=result.state, in_flight=result.in_flight)
        return Response(body, status_code=202 if result.state == "draining" else 200)

    return Router(
        path="/admin", route_handlers=[list_workers, add_worker, remove_worker], guards=list(guards)
    )
