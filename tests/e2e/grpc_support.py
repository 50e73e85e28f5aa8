"""`radixgate serve --grpc-port` as a real process, and the tensors tritonclient sends to it.

The gateway runs in its own process, as users run it: the gateway's generated messages and
tritonclient's own copy of the protocol register the same names (`inference.*`) in protobuf's default
pool, which refuses a second definition, so the two never share a process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from proxy.auth import hash_key

ROOT = Path(__file__).parents[2]
API_KEY = "grpc-test-key"
AUTH = {"authorization": f"Bearer {API_KEY}"}
START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServedGateway:
    """`radixgate serve --config FILE --port P --grpc-port G`; `start()` returns once it is ready."""

    def __init__(self, config: str, directory: Path, env: Mapping[str, str] | None = None) -> None:
        self.http_port = free_port()
        self.grpc_port = free_port()
        config_file = directory / "radixgate.toml"
        keys = f'\n[[auth.api_keys]]\ntenant = "grpc-tests"\nsha256 = "{hash_key(API_KEY)}"\n'
        config_file.write_text(config + keys)
        command = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config_file)]
        ports = ["--port", str(self.http_port), "--grpc-port", str(self.grpc_port), "--log-level", "warning"]
        self._process = subprocess.Popen(
            [*command, *ports],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr = ""

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> ServedGateway:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{self.http_url}/health/ready").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the gateway did not become ready:\n{self.stderr}")
            time.sleep(0.1)

    def active_requests(self) -> int:
        return int(httpx.get(f"{self.http_url}/health").json()["details"]["active_requests"])

    def wait_idle(self, within_s: float = 2.0) -> int:
        deadline = time.monotonic() + within_s
        while (active := self.active_requests()) and time.monotonic() < deadline:
            time.sleep(0.02)
        return active

    def stop(self) -> int | None:
        """SIGTERM, as an orchestrator stops it; the exit status (None when it had to be killed)."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
        try:
            _, self.stderr = self._process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            _, self.stderr = self._process.communicate()
            return None
        return self._process.returncode


def text_inputs(
    prompt: str,
    sampling: dict[str, Any] | None = None,
    *,
    stream: bool | None = None,
    exclude_input: bool | None = True,
) -> list[grpcclient.InferInput]:
    """The tensors of Triton's vLLM backend for one generation request."""
    inputs = [_tensor("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES")]
    if sampling is not None:
        encoded = json.dumps(sampling).encode()
        inputs.append(_tensor("sampling_parameters", np.array([encoded], dtype=np.object_), "BYTES"))
    if stream is not None:
        inputs.append(_tensor("stream", np.array([stream], dtype=np.bool_), "BOOL"))
    if exclude_input is not None:
        inputs.append(_tensor("exclude_input_in_output", np.array([exclude_input], dtype=np.bool_), "BOOL"))
    return inputs


def output_text(result: grpcclient.InferResult) -> str:
    values = result.as_numpy("text_output")
    assert values is not None, "the response has no text_output"
    return b"".join(values.tolist()).decode()


def is_final(result: grpcclient.InferResult) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _tensor(name: str, value: np.ndarray[Any, Any], datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor
