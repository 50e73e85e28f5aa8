"""What a cached `/v1/embeddings` answer costs end to end, beside a miss, in one run.

    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.responses.embeddings_hit [--requests 2000]

A `radixgate serve` process (the CLI, its defaults) in front of the tests' OpenAI-compatible upstream
on loopback; one keep-alive client sends the same embeddings request again and again (every answer
after the first is a response-cache hit), then as many distinct requests (misses, forwarded). Times
are client-side wall time per request. Floor (issue 19): hit p50 <= 2 ms.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import httpx

from benchmarks.routing.cluster import REPO
from proxy.routing.launch import free_port
from tests.upstream_server import UpstreamServer

MODEL = "bench-embedder"
INPUT = ["radixgate answers identical embeddings requests from its response cache"] * 4


def timed(client: httpx.Client, url: str, bodies: list[dict[str, object]], expect: str) -> list[float]:
    seconds = []
    for body in bodies:
        started = time.perf_counter()
        answer = client.post(url, json=body)
        seconds.append(time.perf_counter() - started)
        assert answer.status_code == 200 and answer.headers["x-radixgate-cache"] == expect, answer.text
    return seconds


def percentile(values: list[float], q: float) -> float:
    return round(statistics.quantiles(values, n=100)[int(q * 100) - 1] * 1e3, 3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    upstream = UpstreamServer(models=(MODEL,)).start()
    port = free_port()
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "serve",
            "--port",
            str(port),
            "--worker",
            f"openai={upstream.url}",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1/embeddings"
    try:
        with httpx.Client(timeout=10, trust_env=False) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get(f"http://127.0.0.1:{port}/health/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the gateway did not become ready")
                time.sleep(0.2)
            same = {"model": MODEL, "input": INPUT, "encoding_format": "float"}
            timed(client, url, [same], "miss")
            hits = timed(client, url, [same] * args.requests, "hit")
            distinct = [{**same, "input": [f"{text} {i}" for text in INPUT]} for i in range(args.requests)]
            misses = timed(client, url, distinct, "miss")
    finally:
        gateway.terminate()
        gateway.wait(timeout=10)
        upstream.stop()
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "cpu": platform.processor() or platform.machine(),
                "requests": args.requests,
                "hit_p50_ms": percentile(hits, 0.5),
                "hit_p99_ms": percentile(hits, 0.99),
                "miss_p50_ms": percentile(misses, 0.5),
                "miss_p99_ms": percentile(misses, 0.99),
            }
        )
    )


if __name__ == "__main__":
    main()
