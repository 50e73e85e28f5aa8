"""Cache lines a forwarded request touches from cold: a count that predicts the gateway's CPU per
request at low rates and that the machine's load cannot skew.

At 100 requests/s each request wakes an idle process whose caches the host has meanwhile refilled
with other work; its CPU time then follows the distinct memory it touches (code and data) more
than its instructions (`benchmarks/RESULTS.md`, "## overhead"). This runs `radixgate serve` under
valgrind's callgrind with cache simulation, instrumentation switched on when a generation request
arrives and off once its response is complete (switching it on empties the simulated caches, so
every request starts cold), and reports per request: instructions, and the distinct instruction
and data cache lines (the simulated last-level cache is large enough that each of its misses is a
first touch).

    python -m benchmarks.overhead.cold_lines --requests 40

`--gateway-python-path TREE` measures another checkout's code (`git archive REV | tar -x -C TREE`).
Needs valgrind (with its `valgrind/callgrind.h` header) and a C compiler. Takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.overhead.run import PYTHON, ROOT, start, wait_ready

WARM_REQUESTS = 10
"""Requests served before counting starts (imports, specialisation, the upstream connection);
`cold_lines_serve.py` skips as many."""
_TOGGLES = r"""
#include <valgrind/callgrind.h>
void cold_lines_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cold_lines_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""
_CACHES = ["--I1=32768,8,64", "--D1=32768,8,64", "--LL=268435456,16,64"]


def _request(port: int) -> bytes:
    body = json.dumps(
        {"model": "stub-model", "messages": [{"role": "user", "content": "Say something short about foxes."}]}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer bench\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _send(port: int, count: int) -> None:
    """`count` requests one after the other on one connection, 20 ms apart."""
    request = _request(port)
    with socket.create_connection(("127.0.0.1", port)) as connection:
        for _ in range(count):
            connection.sendall(request)
            data = b""
            while True:
                data += connection.recv(65536)
                end = data.find(b"\r\n\r\n")
                if end >= 0:
                    length = int(data[:end].lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    if len(data) >= end + 4 + length:
                        break
            time.sleep(0.02)


def _totals(out: Path) -> dict[str, int]:
    """The summary line's events of a callgrind output file."""
    events = summary = None
    for line in out.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:"):
            summary = [int(value) for value in line.split()[1:]]
    if events is None or summary is None:
        raise RuntimeError(f"no totals in {out}")
    return dict(zip(events, summary, strict=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--stub-port", type=int, default=9281)
    parser.add_argument("--port", type=int, default=9280)
    parser.add_argument("--gateway-python-path", help="run this checkout's code instead")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("cc") is None:
        sys.exit("cold_lines needs valgrind and a C compiler")
    with tempfile.TemporaryDirectory() as tmp:
        toggles = Path(tmp) / "toggles.so"
        source = Path(tmp) / "toggles.c"
        source.write_text(_TOGGLES)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(toggles), str(source)], check=True)
        out = Path(tmp) / "callgrind.out"
        stub = start("1", [PYTHON, "-m", "benchmarks.overhead.stub", "--port", str(args.stub_port)])
        tree = args.gateway_python_path or str(ROOT)
        env = {**os.environ, "COLD_LINES_TOGGLES": str(toggles), "PYTHONPATH": tree}
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--cache-sim=yes",
            *_CACHES,
            f"--callgrind-out-file={out}",
            PYTHON,
            str(Path(__file__).with_name("cold_lines_serve.py")),
            *("serve", "--upstream", f"http://127.0.0.1:{args.stub_port}", "--model", "stub-model"),
            *("--port", str(args.port), "--log-level", "warning"),
        ]
        gateway = subprocess.Popen(
            command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_ready(f"http://127.0.0.1:{args.port}/health/ready", timeout=300)
            _send(args.port, WARM_REQUESTS + args.requests)
        finally:
            gateway.send_signal(signal.SIGINT)
            gateway.wait(120)
            stub.terminate()
            stub.wait(10)
        totals = _totals(out)
    per_request = {name: value / args.requests for name, value in totals.items()}
    lines = per_request["ILmr"] + per_request["DLmr"] + per_request["DLmw"]
    print(
        json.dumps(
            {
                "requests": args.requests,
                "instructions": round(per_request["Ir"]),
                "instruction_lines": round(per_request["ILmr"]),
                "data_lines_read": round(per_request["DLmr"]),
                "data_lines_written": round(per_request["DLmw"]),
                "cold_lines": round(lines),
            }
        )
    )


if __name__ == "__main__":
    main()
