"""`radixgate serve --cache-dir DIR`: cached answers survive a gateway restart (real CLI processes)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.e2e.conftest import MODEL
from tests.upstream_server import UpstreamServer

REPO = Path(__file__).parents[2]
START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serve(upstream: UpstreamServer, cache_dir: Path) -> Iterator[str]:
    """`radixgate serve --upstream ... --cache-dir DIR` in a child process; yields its `/v1` URL."""
    port = _free_port()
    command = [sys.executable, "-m", "proxy.cli", "serve", "--upstream", upstream.url, "--model", MODEL]
    command += ["--port", str(port), "--cache-dir", str(cache_dir), "--log-level", "warning"]
    # No radixgate.toml or RADIXGATE_* variables of the developer's may leak in.
    environment = {name: value for name, value in os.environ.items() if not name.startswith("RADIXGATE_")}
    environment["PYTHONPATH"] = str(REPO)
    process = subprocess.Popen(command, cwd=cache_dir.parent, env=environment)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, "the gateway exited during startup"
            try:
                if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the gateway did not become ready"
            time.sleep(0.05)
        yield f"{url}/v1"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(15)


def _ask(base_url: str, **options: Any) -> tuple[str, list[str]]:
    """(x-radixgate-cache, every chunk as JSON) of one streamed chat completion."""
    with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=10) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "persist me"}],
            temperature=0,
            stream=True,
            **options,
        )
        return raw.headers["x-radixgate-cache"], [chunk.model_dump_json() for chunk in raw.parse()]


def test_answers_on_disk_survive_a_restart(tmp_path: Path, upstream: UpstreamServer) -> None:
    with serve(upstream, tmp_path) as url:
        first = _ask(url)
    assert list((tmp_path / "responses" / "seg").glob("*.rgs")), "the answer was written to L3"
    with serve(upstream, tmp_path) as url:
        second = _ask(url)
        stats = httpx.get(f"{url}/cache/stats").json()
    assert (first[0], second[0]) == ("miss", "hit")
    assert second[1] == first[1]
    assert len(upstream.generation_requests()) == 1
    assert stats["cache_manager"]["kv_cache"]["l3_hits"] == 1
    assert stats["cache_manager"]["kv_cache"]["disk_bytes"] > 0
