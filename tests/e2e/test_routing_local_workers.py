"""`radixgate serve --workers 2`: two embedded-engine worker processes behind one routing gateway."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from proxy.routing.launch import free_port
from tests.e2e.routing_support import REPO

MODEL = "smollm2-135m-instruct"
STARTUP_TIMEOUT_S = 240.0
SYSTEM = "You are a terse assistant for a hardware store. Answer in one short sentence. " * 6


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "proxy.cli",
        "serve",
        "--workers",
        "2",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    log = tmp_path_factory.mktemp("local-workers") / "gateway.log"
    process = subprocess.Popen(command, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                if httpx.get(base + "/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, f"radixgate serve --workers 2 exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the cluster did not become ready"
            time.sleep(0.5)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)  # the gateway stops its worker processes on the way out
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_two_embedded_engine_workers_serve_and_shared_prefixes_stick(gateway_url: str) -> None:
    workers = httpx.get(gateway_url + "/admin/workers", timeout=5).json()["workers"]
    assert len(workers) == 2 and all(w["health"] == "up" and w["kind"] == "openai" for w in workers)
    assert all(w["tokenizers"] == {MODEL: "gguf"} for w in workers)  # the model's own vocabulary
    with openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        cached = []
        for question in ("Do you sell hammers?", "Do you sell nails?", "Do you sell glue?"):
            answer = client.chat.completions.create(
                model=MODEL,
                max_tokens=4,
                temperature=0,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            )
            assert answer.choices[0].message.content
            assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
            cached.append(answer.usage.prompt_tokens_details.cached_tokens or 0)
    served = sorted(
        w["requests"] for w in httpx.get(gateway_url + "/admin/workers", timeout=5).json()["workers"]
    )
    assert served == [0, 3]  # one worker took the whole shared-prefix conversation ...
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # ... and its engine reused the prefix
