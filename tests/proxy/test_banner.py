"""The start-up banner names the version, model, config file, preset, cache, address and workers."""

from __future__ import annotations

from pathlib import Path

from adapters.local import LocalEngineConfig
from proxy import __version__
from proxy.banner import startup_banner
from proxy.cache.settings import CacheSettings
from proxy.routing.config import WorkerSpec
from proxy.settings import ServerSettings, Settings


def test_banner_in_front_of_workers() -> None:
    settings = Settings(
        workers=[
            WorkerSpec(url="http://vllm:8000", kind="vllm", models=["llama"]),
            WorkerSpec(url="http://sglang:30000", kind="sglang", models=["llama"]),
        ],
        server=ServerSettings(host="0.0.0.0", port=9000),
        cache=CacheSettings(preset="production", dir=Path("/var/cache/rg"), redis_url="redis://r:6379/0"),
    )
    assert startup_banner(settings, Path("/etc/radixgate/radixgate.toml")) == (
        f"radixgate {__version__}: model llama; config /etc/radixgate/radixgate.toml; preset production; "
        "response cache /var/cache/rg + Redis; listening on http://0.0.0.0:9000; "
        "workers http://vllm:8000 (vllm), http://sglang:30000 (sglang)"
    )


def test_banner_of_the_embedded_engine(tmp_path: Path) -> None:
    settings = Settings(local_engine=LocalEngineConfig(cache_dir=tmp_path))
    banner = startup_banner(settings, None)
    assert "model smollm2-135m-instruct;" in banner
    assert "config none (defaults); preset development; response cache memory only;" in banner
    assert banner.endswith(f"workers the embedded engine (weights cache {tmp_path})")
