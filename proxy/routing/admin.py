"""The worker admin API: list, add and remove workers while the gateway runs.

    GET    /admin/workers          every worker: health, circuit, load, tree size, tokenizer
    POST   /admin/workers          add one (a `WorkerSpec` body); 201, or 409 if the id is taken
    DELETE /admin/workers/{id}     stop routing to it; 200 when removed at once, 202 while draining

The app mounts `admin_router(pool)` behind the admin scope (`proxy.auth.admin_guard`).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import msgspec
from litestar import Response, Router, delete, get, post
from litestar.params import FromPath, JSONBody
from litestar.types import Guard

from proxy.errors import ApiError
from proxy.routes.options import options_handler
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
    """Keys in the routing tree (token ids, or UTF-8 bytes: see `units_per_token`)."""
    tree_nodes: int
    tree_memory_bytes: int
    capacity_tokens: int
    capacity_source: str
    """"config", "engine" (reported by the engine) or "default"."""
    capacity_estimate_tokens: int
    """The tree's size limit after corrections from engine-reported cached tokens."""
    predicted_cached_tokens: int
    reported_cached_tokens: int
    predictions: int
    """Requests whose engine reported `cached_tokens` (the two sums above are over these)."""
    mean_prediction_error_tokens: float
    """Mean |predicted - reported| cached tokens per such request (engine tokens)."""
    mispredictions: int
    tokenizers: dict[str, str]
    """Per model the worker serves: "tokenizer.json", "gguf", "engine" or "bytes" (the UTF-8 fallback)."""
    tokenizer_sources: dict[str, str]
    """Per model: "config", or where discovery found it (a path, `WORKER/tokenize`, "utf-8")."""
    units_per_token: float
    """Tree keys per engine token: 1 for token ids, the learned bytes per token for a byte tree."""
    bytes_per_token: dict[str, float]
    """Per byte-routed model, the prompt bytes per engine token learned from reported `prompt_tokens`."""
    engine_load: dict[str, float]
    kv_events: KvEventsStatus | None = None
    kv_events_discovery: str | None = None
    """Why no KV events are followed, when the worker was asked (`proxy.routing.kv_discovery`)."""


class KvRankStatus(msgspec.Struct, kw_only=True):
    """One data-parallel rank's event stream (each numbers, replays and resets on its own)."""

    rank: int
    endpoint: str
    last_seq: int | None
    blocks: int
    events: int
    replayed: int
    resets: int


class KvEventsStatus(msgspec.Struct, kw_only=True):
    """A worker's KV-event feed as `GET /admin/workers` shows it (counts summed over its ranks)."""

    endpoint: str
    source: str
    """"config", or "discovered: ..." with the addresses the engine reported."""
    live: bool
    """True while the index routes; False before the first event and after events stopped."""
    last_seq: int | None
    """Rank 0's (the first rank's) last sequence number; every rank's in `ranks`."""
    blocks: int
    blocks_by_medium: dict[str, int]
    block_size: int
    events: int
    replayed: int
    resets: int
    orphans: int
    ranks: list[KvRankStatus]
    """Per data-parallel rank followed, in rank order (one entry for an engine without DP)."""


class WorkerList(msgspec.Struct, kw_only=True):
    policy: str
    workers: list[WorkerStatus]
    panic: dict[str, str] = msgspec.field(default_factory=dict)
    """Models whose every worker is marked down, with the most recently healthy worker their
    requests are tried on anyway (panic mode)."""


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
        predictions=worker.predictions,
        mean_prediction_error_tokens=round(worker.prediction_error_tokens / worker.predictions, 1)
        if worker.predictions
        else 0.0,
        mispredictions=worker.mispredictions,
        tokenizers=pool.prompts.kinds(models),
        tokenizer_sources=pool.prompts.sources(models),
        units_per_token=round(worker.units_per_token, 3),
        bytes_per_token={model: round(ratio, 3) for model, ratio in worker.bytes_per_token.items()},
        engine_load=dict(worker.engine_load),
        kv_events=_kv_status(worker),
        kv_events_discovery=worker.kv_events_discovery,
    )


def _kv_status(worker: Worker) -> KvEventsStatus | None:
    feed = worker.kv_events
    if feed is None:
        return None
    ranks = [
        KvRankStatus(
            rank=stream.rank,
            endpoint=stream.endpoint,
            last_seq=stream.last_seq,
            blocks=stream.index.blocks,
            events=stream.index.events,
            replayed=stream.replayed,
            resets=stream.resets,
        )
        for stream in feed.streams
    ]
    return KvEventsStatus(
        endpoint=feed.spec.endpoint,
        source=feed.source,
        live=feed.live(),
        last_seq=ranks[0].last_seq,
        blocks=feed.blocks,
        blocks_by_medium=feed.blocks_by_medium(),
        block_size=feed.block_size,
        events=sum(rank.events for rank in ranks),
        replayed=feed.replayed,
        resets=feed.resets,
        orphans=sum(stream.index.orphans for stream in feed.streams),
        ranks=ranks,
    )


def allowed_hosts(pool: WorkerPool, configured: Sequence[str] | None) -> frozenset[str]:
    """`routing.allowed_worker_hosts`, or by default the hosts of the pool's workers and loopback."""
    if configured is not None:
        return frozenset(host.lower() for host in configured)
    hosts = {urlsplit(worker.spec.url).hostname or "" for worker in pool.workers()}
    return frozenset({*(host.lower() for host in hosts if host), *LOOPBACK_HOSTS})


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _event_hosts(spec: WorkerSpec) -> frozenset[str]:
    """Hosts a worker's KV-event sockets connect to; an `ipc://` path counts as no permitted host
    (a run-time worker may not open local socket files)."""
    events = spec.kv_events
    if events is None:
        return frozenset()
    hosts = set()
    for endpoint in (events.endpoint, events.replay_endpoint):
        if endpoint is None:
            continue
        if not endpoint.startswith("tcp://"):
            hosts.add("ipc://")
            continue
        hosts.add(endpoint.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]").lower())
    return frozenset(hosts)


def admin_router(
    pool: WorkerPool, *, guards: Sequence[Guard] = (), worker_hosts: frozenset[str] | None = None
) -> Router:
    """A Litestar router serving the worker admin API over `pool`; a worker added at run time must
    point at one of `worker_hosts` (default: `allowed_hosts(pool, None)` as the pool is now)."""
    permitted = worker_hosts if worker_hosts is not None else allowed_hosts(pool, None)

    @get("/workers", sync_to_thread=False)
    def list_workers() -> WorkerList:
        return WorkerList(
            policy=pool.policy.name,
            workers=[worker_status(pool, w) for w in pool.workers()],
            panic=pool.panicking(),
        )

    @post("/workers", status_code=201)
    async def add_worker(data: JSONBody[WorkerSpec]) -> WorkerStatus:
        if data.kind == "local" or not data.url.startswith(("http://", "https://")):
            raise ApiError(
                400,
                "A worker added at run time is a remote engine (sglang, vllm or openai) at an http(s) URL; "
                "the embedded engine is configured in [local_engine].",
                param="kind",
                code="invalid_worker",
            )
        try:
            parts = urlsplit(data.url)
            host = (parts.hostname or "").lower()
            _ = parts.port  # raises for a port that is not a number (the url pattern admits none)
        except ValueError as exc:
            raise ApiError(400, f"Invalid worker url: {exc}", param="url", code="invalid_worker") from None
        event_hosts = _event_hosts(data)
        if host not in permitted or not event_hosts <= permitted:
            raise ApiError(
                403,
                f"Workers (and their KV-event sockets) may point only at {', '.join(sorted(permitted))} "
                "(`routing.allowed_worker_hosts`).",
                error_type="permission_error",
                param="url" if host not in permitted else "kv_events",
                code="worker_host_not_allowed",
            )
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
        path="/admin",
        # The OPTIONS handler first: registered after the others, Litestar's automatic one would win.
        route_handlers=[
            options_handler("/workers", ("GET", "POST")),
            list_workers,
            add_worker,
            remove_worker,
        ],
        guards=list(guards),
    )
