"""Python function calls per forwarded request, by upstream client: a measure the machine's load
cannot skew (CPU time on a shared machine can).

For each client, the gateway runs under uvicorn with cProfile counting calls (serve.py
--count-calls) twice: once idle and once under `--requests` non-streaming requests at
`--rate`; calls per request = (loaded - idle) / requests.

    python -m benchmarks.overhead.calls --requests 2000
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.overhead.run import PYTHON, ROOT, start, wait_ready
from benchmarks.overhead.serve import CLIENTS


def count_calls(client: str, stub_port: int, port: int, load: list[str] | None, seconds: float) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "calls"
        command = [
            PYTHON,
            "-m",
            "benchmarks.overhead.serve",
            "--server",
            "uvicorn",
            "--client",
            client,
            "--upstream",
            f"http://127.0.0.1:{stub_port}",
            "--port",
            str(port),
            "--count-calls",
            str(out),
        ]
        gateway = start("0", command)
        try:
            wait_ready(f"http://127.0.0.1:{port}/health/ready")
            started = time.monotonic()
            if load is not None:
                subprocess.run(load, cwd=ROOT, check=True, capture_output=True)
            time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        finally:
            gateway.send_signal(signal.SIGINT)
            gateway.wait(30)
        return int(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--stub-port", type=int, default=9191)
    parser.add_argument("--port", type=int, default=9190)
    args = parser.parse_args()
    duration = args.requests / args.rate
    load = [
        "taskset", "-c", "1", PYTHON, "-m", "benchmarks.overhead.loadgen", "--port", str(args.port),
        "--rate", str(args.rate), "--duration", str(duration),
    ]  # fmt: skip
    stub = start("1", [PYTHON, "-m", "benchmarks.overhead.stub", "--port", str(args.stub_port)])
    results = {}
    try:
        for client in CLIENTS:
            idle = count_calls(client, args.stub_port, args.port, None, duration + 2)
            loaded = count_calls(client, args.stub_port, args.port, load, duration + 2)
            results[client] = round((loaded - idle) / args.requests)
            print(f"{client}: {results[client]} calls per request", file=sys.stderr)
    finally:
        stub.terminate()
        stub.wait(10)
    print(json.dumps({"requests": args.requests, "python_calls_per_request": results}))


if __name__ == "__main__":
    main()
