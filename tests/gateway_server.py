"""Run a real gateway (uvicorn, the app from `create_app`) on a loopback port in a thread."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn
from litestar import Litestar

from proxy.http_protocol import guarded_protocol
from proxy.settings import ServerSettings


class GatewayServer:
    """`start()` returns once the app's lifespan has started; `url` ends in `/v1`."""

    def __init__(self, app: Litestar, *, keep_alive_s: float = 5.0, http: Any = None) -> None:
        """`http`: uvicorn's protocol; default the one `radixgate serve` runs, with the app's limits."""
        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
            timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type]  # uvicorn reads it as seconds
            loop="uvloop",  # as `radixgate serve` runs it
            http=http or _served_protocol(app),
            ws="none",  # no WebSocket routes: an Upgrade request is served as plain HTTP, never left hanging
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="gateway", daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1"

    def start(self) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._socket.close()


def _served_protocol(app: Any) -> Any:
    """The protocol `radixgate serve` gives uvicorn, with the head limits of the app's settings."""
    gateway = getattr(getattr(app, "state", None), "gateway", None)
    server = gateway.settings.server if gateway is not None else ServerSettings()
    return guarded_protocol(server.header_timeout_s, server.max_header_bytes)
