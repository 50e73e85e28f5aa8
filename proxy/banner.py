"""The one log line `radixgate serve` writes before it starts: what runs, from which files, where."""

from __future__ import annotations

from pathlib import Path

from proxy import __version__
from proxy.settings import Settings


def startup_banner(settings: Settings, config_file: Path | None) -> str:
    """`radixgate VERSION: model ..., config ..., preset ..., cache ..., listening on ..., workers ...`."""
    if settings.workers:
        models = sorted({model for worker in settings.workers for model in worker.models})
        model = ", ".join(models) if models else "as the workers list them"
        workers = ", ".join(f"{w.url} ({w.kind})" for w in settings.workers)
    else:
        engine = settings.local_engine
        model = engine.model_id + (f" from {engine.model_path}" if engine.model_path else "")
        workers = f"the embedded engine (weights cache {engine.resolved_cache_dir()})"
    cache = str(settings.cache.dir) if settings.cache.dir is not None else "memory only"
    if settings.cache.redis_url is not None:
        cache += " + Redis"
    server = settings.server
    return (
        f"radixgate {__version__}: model {model}; config {config_file or 'none (defaults)'}; "
        f"preset {settings.cache.preset}; response cache {cache}; "
        f"listening on http://{server.host}:{server.port}; workers {workers}"
    )
