"""Starting engine worker processes next to the gateway, so one command brings up a cluster.

    radixgate serve --workers N                  N embedded-engine gateways on loopback ports
    radixgate serve --launch-sglang PATH [--replicas N]   N SGLang servers (GPU host, `sglang` extra)

Each launched process gets a free 127.0.0.1 port and becomes a worker of the pool. The gateway
waits until every process answers its health endpoint, and terminates them when it exits.
On Linux each child also asks the kernel for SIGTERM when the gateway dies (`PR_SET_PDEATHSIG`), so
a gateway killed with SIGKILL leaves no orphaned workers behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec

DEFAULT_STARTUP_TIMEOUT_S = 600.0
"""Seconds a launched worker may take to become healthy (SGLang loads weights and captures graphs)."""
DEFAULT_SGLANG_MEM_FRACTION = 0.85
STOP_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal a process gets when its parent thread exits."""


def _die_with_parent() -> None:
    """Run in the child between fork and exec: SIGTERM this process when the gateway goes away."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    return subprocess.Popen(command, env=env, preexec_fn=preexec)


class SGLangLaunchSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """SGLang servers the gateway starts and routes over (`--launch-sglang`)."""

    model_path: str
    """Model directory or Hugging Face id, passed as `--model-path`."""
    replicas: int = 1
    """Servers to start."""
    share_gpu: bool = False
    """Run every replica on GPU 0 with `--mem-fraction-static` split between them; otherwise replica
    i uses GPU i (`--base-gpu-id i`)."""
    extra_args: list[str] = msgspec.field(default_factory=list)
    """More `sglang.launch_server` arguments, e.g. `["--tp", "2"]`."""
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now on `host`."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def sglang_command(
    settings: SGLangLaunchSettings, replica: int, port: int, python: str = sys.executable
) -> list[str]:
    """The `sglang.launch_server` command line of one replica: cache reporting and metrics on, so the
    router gets `cached_tokens` back and can read the server's load."""
    command = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        settings.model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-cache-report",
        "--enable-metrics",
    ]
    if settings.share_gpu and settings.replicas > 1:
        command += ["--mem-fraction-static", f"{DEFAULT_SGLANG_MEM_FRACTION / settings.replicas:.3f}"]
    else:
        command += ["--base-gpu-id", str(replica)]
    return command + list(settings.extra_args)


def local_worker_command(port: int, config_file: Path, python: str = sys.executable) -> list[str]:
    """A child gateway serving only its embedded engine (`--workers 0`: it never launches more)."""
    return [
        python,
        "-m",
        "proxy.cli",
        "serve",
        "--config",
        str(config_file),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "0",
    ]


@dataclass(slots=True)
class Launched:
    """One started worker process."""

    kind: str
    url: str
    health_path: str
    process: subprocess.Popen[bytes]


@dataclass(slots=True)
class Launcher:
    """Starts worker processes, waits for them, and stops them all on exit."""

    launched: list[Launched] = field(default_factory=list)
    _tempdir: tempfile.TemporaryDirectory[str] | None = None

    def start_local(self, count: int, child_toml: str) -> list[Launched]:
        """Start `count` embedded-engine gateways configured by `child_toml`."""
        self._tempdir = self._tempdir or tempfile.TemporaryDirectory(prefix="radixgate-workers-")
        config = Path(self._tempdir.name) / f"worker-{len(self.launched)}.toml"
        config.write_text(child_toml)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXGATE_")}
        started = []
        for _ in range(count):
            port = free_port()
            process = _spawn(local_worker_command(port, config), env)
            started.append(Launched("openai", f"http://127.0.0.1:{port}", "/health/ready", process))
        self.launched += started
        return started

    def start_sglang(self, settings: SGLangLaunchSettings) -> list[Launched]:
        """Start the SGLang replicas; RuntimeError when the `sglang` package is not installed."""
        if importlib.util.find_spec("sglang") is None:
            raise RuntimeError("--launch-sglang needs SGLang: pip install 'radixgate[sglang]' on a GPU host")
        started = []
        for replica in range(settings.replicas):
            port = free_port()
            process = _spawn(sglang_command(settings, replica, port))
            started.append(Launched("sglang", f"http://127.0.0.1:{port}", "/health", process))
        self.launched += started
        return started

    def wait_healthy(self, workers: Sequence[Launched], timeout_s: float) -> None:
        """Block until every worker answers 200 on its health path; RuntimeError if one dies or times out."""
        deadline = time.monotonic() + timeout_s
        pending = list(workers)
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while pending:
                for worker in list(pending):
                    if worker.process.poll() is not None:
                        raise RuntimeError(
                            f"worker {worker.url} exited with status {worker.process.returncode}"
                        )
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(worker.url + worker.health_path).status_code == 200:
                            pending.remove(worker)
                if pending and time.monotonic() > deadline:
                    raise RuntimeError(
                        f"workers not healthy after {timeout_s:.0f} s: {[w.url for w in pending]}"
                    )
                if pending:
                    time.sleep(0.25)

    def stop(self) -> None:
        """Terminate every launched process (SIGTERM, then SIGKILL after a grace period)."""
        for worker in self.launched:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for worker in self.launched:
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        self.launched.clear()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
