"""The embedded engine's prefix cache outlives the process: `radixgate serve --cache-dir DIR` as a user
runs it (a real process, the default SmolLM2 model, the openai SDK), restarted by SIGTERM or killed.

Requests carry `Cache-Control: no-store`, so the response cache stays out of the way and the engine
runs every one; greedy answers are compared with the first run, computed from scratch.

The engine runs its exact mode (`EXACT`: fp32 decode weights, so an fp32 pool). Where the C kernels
do not run, the default decodes on torch's packed int4 products, which round unlike the fp32
products of prompt rows: a prompt whose 832 of 840 tokens come from the cache computes its last 8
as decode-sized rows and may answer otherwise than a cold prefill, with no disk involved (seen with
AVX2 code: the second ask of one process already differed). These tests are about what reads back
from disk; the exact mode makes an answer independent of how its prompt is split on every host.
"""

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

import httpx
import openai
import pytest

from adapters.local.config import DEFAULT_MODEL_ID

ROOT = Path(__file__).parents[2]
SYSTEM = " ".join(
    f"Rule {n}: answer politely, cite the handbook section {n}, and keep it short." for n in range(40)
)
QUESTION = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is rule 7?"}]
NO_STORE = {"Cache-Control": "no-store"}
EXACT = {"RADIXGATE_LOCAL_ENGINE__DECODE_WEIGHTS": "fp32"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serve(cache_dir: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A `radixgate serve --cache-dir` process, once ready; killed if the test left it running."""
    port = _free_port()
    command = [sys.executable, "-m", "proxy.cli", "serve", "--cache-dir", str(cache_dir), "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--log-level", "info"],
        cwd=ROOT,
        env={**os.environ, **EXACT},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "the gateway did not become ready"
            time.sleep(0.2)
        yield process, f"http://127.0.0.1:{port}/v1"
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=60)


def ask(base_url: str) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached prompt tokens) of the greedy question."""
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as client:
        reply = client.chat.completions.create(
            model=DEFAULT_MODEL_ID, messages=QUESTION, max_tokens=12, temperature=0, extra_headers=NO_STORE
        )
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return (
        reply.choices[0].message.content or "",
        usage.prompt_tokens,
        usage.prompt_tokens_details.cached_tokens or 0,
    )


def stop(process: subprocess.Popen[str], how: signal.Signals) -> str:
    process.send_signal(how)
    _, stderr = process.communicate(timeout=120)
    return stderr


@pytest.mark.slow
def test_a_prefix_used_before_sigterm_is_a_prefix_hit_after_restart(tmp_path: Path) -> None:
    with serve(tmp_path) as (process, url):
        cold, prompt_tokens, cached = ask(url)
        assert prompt_tokens > 600 and cached == 0
        stderr = stop(process, signal.SIGTERM)
    assert process.returncode in (0, -signal.SIGTERM), stderr
    assert "KV write-behind flush" in stderr and "Traceback" not in stderr

    with serve(tmp_path) as (process, url):
        warm, again_tokens, cached = ask(url)
        stats = httpx.get(f"{url}/cache/stats").json()["cache_manager"]
        stop(process, signal.SIGTERM)
    assert again_tokens == prompt_tokens
    assert cached >= 0.9 * prompt_tokens
    assert warm == cold  # the KV read back from disk gives the tokens recomputation gave
    (pages,) = stats["kv_cache"]["kv_pages"]
    assert pages["loaded_pages"] * 16 == cached
    assert stats["radix_tree"]["prefix_matches"] >= cached


@pytest.mark.slow
def test_sigkill_during_write_behind_leaves_nothing_that_reads_back_wrong(tmp_path: Path) -> None:
    with serve(tmp_path) as (process, url):
        cold, _, _ = ask(url)
        ask(url)  # the second use makes every page due: the writer is busy with them now
        stop(process, signal.SIGKILL)
    assert process.returncode == -signal.SIGKILL

    with serve(tmp_path) as (process, url):
        after, _, _ = ask(url)  # whatever reached the disk intact is used; the rest is recomputed
        stderr = stop(process, signal.SIGTERM)
    assert after == cold
    assert "Traceback" not in stderr
