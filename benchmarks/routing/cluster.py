"""Processes of a routing benchmark on loopback: simulated workers, gateways, sglang-router."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from adapters.engine_metrics import parse_prometheus
from benchmarks.routing.sim_core import SimConfig
from proxy.routing.launch import free_port

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0


@dataclass(slots=True)
class Proc:
    """One started process and the URL it serves."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    health_path: str


@dataclass(slots=True)
class WorkerCounters:
    """What a simulated worker counted (from its `/metrics`)."""

    requests: float
    prompt_tokens: float
    cached_tokens: float
    busy_s: float
    """Simulated engine seconds spent on prefill and decode (not scaled to wall time)."""

    def minus(self, before: WorkerCounters) -> WorkerCounters:
        return WorkerCounters(
            self.requests - before.requests,
            self.prompt_tokens - before.prompt_tokens,
            self.cached_tokens - before.cached_tokens,
            self.busy_s - before.busy_s,
        )


def free_port_is(port: int) -> bool:
    """True when `port` can be bound on loopback now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(slots=True)
class LoopbackPorts:
    """Free loopback ports for processes about to start, none handed out twice."""

    given: set[int] = field(default_factory=set)
    """Ports handed out: a port `free_port` returns stays free until its process binds it, so the next
    call can return it again (two workers on one port: one dies, the other is counted twice)."""

    def port(self) -> int:
        """A free port not handed out yet."""
        while (port := free_port()) in self.given:
            pass
        self.given.add(port)
        return port

    def event_port(self) -> int:
        """A free port whose successor is free too (a KV-event PUB socket and its replay socket).
        Checked, not assumed: ephemeral binds come odd, so the successor is an even port, the kind
        outgoing connections take."""
        while True:
            port = self.port()
            if port + 1 not in self.given and free_port_is(port + 1):
                self.given.add(port + 1)
                return port


@dataclass(slots=True)
class Cluster:
    """Starts processes, waits for them, and stops every one it started (by pid)."""

    logs: Path
    procs: list[Proc] = field(default_factory=list)
    ports: LoopbackPorts = field(default_factory=LoopbackPorts)

    def port(self) -> int:
        """A free port no process of this cluster was given yet."""
        return self.ports.port()

    def start(
        self,
        name: str,
        command: Sequence[str],
        port: int,
        health_path: str,
        env: dict[str, str] | None = None,
    ) -> Proc:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            list(command), stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **(env or {})}
        )
        proc = Proc(name, f"http://127.0.0.1:{port}", process, health_path)
        self.procs.append(proc)
        return proc

    def sim_worker(
        self, index: int, config: SimConfig, tokenizer: Path, offer: str = "path", kv_events_port: int = 0
    ) -> Proc:
        """One simulated worker; with `kv_events_port`, it publishes KV events there (replay: +1)."""
        port = self.port()
        args = [
            sys.executable,
            "-m",
            "benchmarks.routing.sim_engine",
            "--port",
            str(port),
            "--tokenizer",
            str(tokenizer),
            "--offer-tokenizer",
            offer,
        ]
        if kv_events_port:
            args += ["--kv-events-port", str(kv_events_port)]
        for name in SimConfig.__dataclass_fields__:
            args += ["--" + name.replace("_", "-"), str(getattr(config, name))]
        return self.start(f"worker{index}", args, port, "/health")

    def gateway(
        self, name: str, workers: Sequence[Proc], policy: str, config: Path, env: dict[str, str] | None = None
    ) -> Proc:
        port = self.port()
        args = [
            sys.executable,
            "-m",
            "proxy.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            "--policy",
            policy,
            "--log-level",
            "warning",
        ]
        for worker in workers:  # none when the config lists them (with their KV-event sockets)
            args += ["--worker", f"sglang={worker.url}"]
        return self.start(name, args, port, "/health/ready", env)

    def event_ports(self) -> int:
        """A free port whose successor is free too (a KV-event PUB socket and its replay socket)."""
        return self.ports.event_port()

    def sglang_router(self, name: str, workers: Sequence[Proc], binary_python: Path, tokenizer: Path) -> Proc:
        port = self.port()
        args = [
            str(binary_python),
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            "cache_aware",
            "--tokenizer-path",
            str(tokenizer),
            "--log-level",
            "warn",
            "--prometheus-port",
            str(self.port()),
            "--worker-urls",
            *[w.url for w in workers],
        ]
        # Offline: it must not try to reach a model hub for the tokenizer.
        return self.start(name, args, port, "/health", env={"HF_HUB_OFFLINE": "1"})

    def wait_ready(self, procs: Sequence[Proc], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(procs)
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while pending:
                for proc in list(pending):
                    if proc.process.poll() is not None:
                        raise RuntimeError(f"{proc.name} exited early; see {self.logs / proc.name}.log")
                    try:
                        if client.get(proc.url + proc.health_path).status_code == 200:
                            pending.remove(proc)
                    except httpx.HTTPError:
                        pass
                if pending and time.monotonic() > deadline:
                    raise RuntimeError(f"not ready: {[p.name for p in pending]}")
                time.sleep(0.2)

    def stop(self, procs: Sequence[Proc] | None = None) -> None:
        targets = list(procs) if procs is not None else list(self.procs)
        for proc in targets:
            if proc.process.poll() is None:
                proc.process.send_signal(signal.SIGTERM)
        for proc in targets:
            try:
                proc.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.process.kill()
                proc.process.wait()
            self.procs.remove(proc)


def cpu_seconds(proc: Proc) -> float:
    """User + system CPU seconds the process has used so far (Linux `/proc/PID/stat`)."""
    fields = Path(f"/proc/{proc.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_counters(worker: Proc) -> WorkerCounters:
    """The simulated worker's own request and token counters."""
    text = httpx.get(worker.url + "/metrics", timeout=5, trust_env=False).text
    names = ["num_requests_total", "prompt_tokens_total", "cached_tokens_total", "sim_busy_seconds_total"]
    found = parse_prometheus(text, [f"sglang:{name}" for name in names])
    return WorkerCounters(*(found.get(f"sglang:{name}", 0.0) for name in names))


def flush_workers(workers: Sequence[Proc]) -> None:
    """Empty every worker's prefix cache (they are idle between runs)."""
    for worker in workers:
        for _ in range(50):
            if httpx.post(worker.url + "/flush_cache", timeout=5, trust_env=False).status_code == 200:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"{worker.name} kept refusing /flush_cache")
