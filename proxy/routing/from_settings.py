"""The gateway's `Settings` turned into a `WorkerPool`: upstream workers, or the embedded engine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from adapters.base import Engine
from adapters.local.config import WINDOW_KEYS, default_model_path
from proxy.routing.config import WorkerSpec
from proxy.routing.launch import DEFAULT_STARTUP_TIMEOUT_S, Launcher
from proxy.routing.pool import WorkerPool
from proxy.routing.registry import http_engine_factory, worker_id_of
from proxy.settings import Settings

if TYPE_CHECKING:
    from proxy.telemetry import Telemetry

LOCAL_WORKER_ID = "local"


def build_pool(settings: Settings, telemetry: Telemetry | None = None) -> WorkerPool:
    """Upstream workers when any are configured, otherwise one embedded-engine worker."""

    def local_engine(spec: WorkerSpec) -> Engine:
        # Imported here: the embedded engine pulls in torch, which an upstream-only gateway never needs.
        from adapters.local import create_local_engine
        from proxy.cache.config import local_engine_config

        return create_local_engine(local_engine_config(settings))

    if settings.workers:
        specs = _unique_ids(list(settings.workers))
    else:
        model = settings.local_engine.model_id
        specs = [WorkerSpec(kind="local", url="local://embedded", id=LOCAL_WORKER_ID, models=[model])]
    models = [model for spec in specs for model in spec.models]
    return WorkerPool(
        models,
        specs,
        settings.routing,
        health_timeout_s=settings.upstream_client.health_timeout_s,
        engine_factory=http_engine_factory(settings.upstream_client, local_engine),
        metrics=telemetry.prometheus if telemetry is not None else None,
        tracer=telemetry.tracer if telemetry is not None else None,
    )


def _unique_ids(specs: list[WorkerSpec]) -> list[WorkerSpec]:
    """Give each spec an id, suffixing `#2`, `#3` when two workers would share one."""
    taken: set[str] = set()
    named = []
    for spec in specs:
        base = spec.id or worker_id_of(spec)
        candidate, suffix = base, 2
        while candidate in taken:
            candidate, suffix = f"{base}#{suffix}", suffix + 1
        taken.add(candidate)
        named.append(msgspec.structs.replace(spec, id=candidate))
    return named


def child_worker_toml(settings: Settings) -> str:
    """The config of a launched embedded-engine worker: the parent's `[local_engine]` and log level.

    With `--cache-dir` (or `local_engine.kv_offload`) the workers offload evicted KV pages to memory
    only: a disk tier belongs to one process and the workers share one config; to give each worker
    its own disk tier, run them yourself with their own `kv_offload_dir` and `--worker` them in."""
    from proxy.cache.config import local_engine_config

    engine = dataclasses.replace(local_engine_config(settings), kv_offload_dir=None)
    lines = ["[server]", f"log_level = {json.dumps(settings.server.log_level)}", "", "[local_engine]"]
    for name, value in dataclasses.asdict(engine).items():
        if value is not None and name not in WINDOW_KEYS:
            lines.append(f"{name} = {json.dumps(str(value) if isinstance(value, Path) else value)}")
    lines += [
        "",
        "[sliding_window]",  # the window is configured there, not in [local_engine]
        f"enabled = {json.dumps(engine.sliding_window)}",
        f"window_size = {engine.window_size}",
        f"window_overlap = {engine.window_overlap}",
        f"sink_tokens = {engine.window_sink_tokens}",
    ]
    return "\n".join(lines) + "\n"


def with_launched_workers(settings: Settings, launcher: Launcher) -> Settings:
    """Start the worker processes `[routing]` asks for, wait until they are healthy, and return the
    settings with them added to `workers`."""
    routing = settings.routing
    added: list[WorkerSpec] = []
    if routing.local_workers:
        config = child_worker_toml(settings)
        # The first worker alone: on a cold machine it converts and caches the weights, which the
        # others then load, instead of several processes converting into the same cache at once.
        started = launcher.start_local(1, config)
        launcher.wait_healthy(started, DEFAULT_STARTUP_TIMEOUT_S)
        if routing.local_workers > 1:
            rest = launcher.start_local(routing.local_workers - 1, config)
            launcher.wait_healthy(rest, DEFAULT_STARTUP_TIMEOUT_S)
            started += rest
        model = settings.local_engine.model_id
        added += [WorkerSpec(url=w.url, kind="openai", models=[model]) for w in started]
        if model not in routing.tokenizers:  # route on the model's own token ids, not UTF-8 bytes
            gguf = settings.local_engine.model_path or default_model_path()
            routing = msgspec.structs.replace(routing, tokenizers={**routing.tokenizers, model: str(gguf)})
            settings = msgspec.structs.replace(settings, routing=routing)
    if routing.launch_sglang is not None:
        started = launcher.start_sglang(routing.launch_sglang)
        launcher.wait_healthy(started, routing.launch_sglang.startup_timeout_s)
        added += [WorkerSpec(url=w.url, kind="sglang") for w in started]
    if not added:
        return settings
    return msgspec.structs.replace(settings, workers=[*settings.workers, *added])
