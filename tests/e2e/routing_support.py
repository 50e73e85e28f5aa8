"""Simulated engine workers as real processes, and a real gateway routing over them (for e2e tests)."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import msgspec

from adapters.engine_metrics import parse_prometheus
from adapters.openai_compat import UpstreamClientConfig
from proxy.app import create_app
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.routing.launch import free_port
from proxy.settings import Settings
from tests.gateway_server import GatewayServer

REPO = Path(__file__).resolve().parents[2]
MODEL = "sim-model"


@dataclass
class SimWorker:
    """One `benchmarks.routing.sim_engine` process on a fixed loopback port (restartable)."""

    port: int
    time_scale: float = 0.05
    process: subprocess.Popen[bytes] | None = None
    extra_args: tuple[str, ...] = ()
    """More `sim_engine` flags (`--kv-events-port`, `--offer-tokenizer`, `--capacity-tokens`)."""
    stderr: IO[bytes] | None = None
    """The process's stderr, kept so that a worker that fails to start says why."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SimWorker:
        command = [
            sys.executable,
            "-m",
            "benchmarks.routing.sim_engine",
            "--port",
            str(self.port),
            "--model",
            MODEL,
            "--time-scale",
            str(self.time_scale),
            "--stream-interval",
            "4",
            *self.extra_args,
        ]
        self._close_stderr()
        # Open for the process's life (closed by `stop`); a pipe could fill and block the worker.
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=self.stderr)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                self.stderr.seek(0)
                said = self.stderr.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"sim worker on port {self.port} did not start:\n{said}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no goodbye, connections reset, like a crashed engine."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._close_stderr()

    def _close_stderr(self) -> None:
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None

    def requests_served(self) -> float:
        """Requests this engine admitted, from its own `/metrics`."""
        text = httpx.get(self.url + "/metrics", timeout=5).text
        return parse_prometheus(text, ["sglang:num_requests_total"]).get("sglang:num_requests_total", 0.0)


def start_workers(count: int, time_scale: float = 0.05) -> list[SimWorker]:
    return [SimWorker(free_port(), time_scale).start() for _ in range(count)]


def stop_all(workers: Sequence[SimWorker]) -> None:
    for worker in workers:
        worker.stop()


def start_gateway(
    workers: Sequence[SimWorker], *, specs: Sequence[WorkerSpec] = (), **routing: object
) -> GatewayServer:
    """A gateway (in this process, on a loopback port) routing over `workers` as SGLang workers
    (or over `specs`, when given)."""
    options: dict[str, object] = {
        "max_attempts": 3,
        "backoff_base_s": 0.01,
        "health_interval_s": 0.2,
        "health_failure_threshold": 1,
    }
    options.update(routing)
    settings = Settings(
        workers=list(specs)
        or [WorkerSpec(url=w.url, kind="sglang", models=[MODEL], id=f"w{i}") for i, w in enumerate(workers)],
        routing=msgspec.convert(options, RoutingSettings),
        upstream_client=UpstreamClientConfig(connect_timeout_s=1, read_timeout_s=30, health_timeout_s=1),
    )
    return GatewayServer(create_app(settings)).start()


def admin_workers(gateway: GatewayServer) -> dict[str, dict[str, object]]:
    """`GET /admin/workers`, keyed by worker id."""
    body = httpx.get(gateway.base_url + "/admin/workers", timeout=5).json()
    return {row["id"]: row for row in body["workers"]}


def wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    """Poll `predicate()` until true; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)
