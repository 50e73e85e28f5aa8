"""`radixgate serve --upstream URL --model NAME --port P` as a user runs it: a real process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from tests.e2e.conftest import MODEL
from tests.upstream_server import UpstreamServer

ROOT = Path(__file__).parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_serve_in_front_of_an_upstream(upstream: UpstreamServer) -> None:
    port = _free_port()
    command = [sys.executable, "-m", "proxy.cli", "serve", "--upstream", upstream.url, "--model", MODEL]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--log-level", "info"], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "the gateway did not become ready"
            time.sleep(0.1)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0) as sdk:
            reply = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "Hello from the test upstream."
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal so the exit status says SIGTERM.
    assert process.returncode in (0, -signal.SIGTERM), stderr
    assert "Traceback" not in stderr
    (banner,) = [line for line in stderr.splitlines() if " radixgate: radixgate " in line]
    assert f"model {MODEL}; config none (defaults); preset development;" in banner
    assert banner.endswith(f"listening on http://127.0.0.1:{port}; workers {upstream.url} (openai)")
