"""The gateway app behind a chosen ASGI server, for comparing servers on the same app.

    python -m benchmarks.overhead.serve --server uvicorn --upstream http://127.0.0.1:9181 --port 9180
    python -m benchmarks.overhead.serve --server granian --upstream http://127.0.0.1:9181 --port 9180

The app is exactly `proxy.app.create_app` with one upstream serving `stub-model`; only the
server around it changes. (`radixgate serve` is measured by `run.py --server cli`.)
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

from litestar import Litestar, get
from litestar.handlers import asgi
from litestar.types import Receive, Scope, Send

from adapters import upstream_client
from adapters.upstream_client import TransportName, UpstreamClientConfig
from benchmarks.overhead.asyncio_backend import fast_transport
from benchmarks.overhead.stub import COMPLETION
from proxy.app import create_app
from proxy.routing.config import WorkerSpec
from proxy.settings import Settings
from proxy.telemetry import Telemetry, TelemetrySettings

UPSTREAM_VARIABLE = "RADIXGATE_BENCH_UPSTREAM"
TRANSPORT_VARIABLE = "RADIXGATE_BENCH_TRANSPORT"
CLIENTS = ("fast", "httpx", "asyncio-backend")
"""`upstream_client.transport` values, and the asyncio-backend experiment (httpcore on asyncio protocols)."""


def app_factory() -> Litestar:
    """The gateway in front of the upstream named by $RADIXGATE_BENCH_UPSTREAM, its upstream client on
    the transport named by $RADIXGATE_BENCH_TRANSPORT (`upstream_client.transport`)."""
    upstream = os.environ[UPSTREAM_VARIABLE]
    transport: TransportName = "httpx" if os.environ.get(TRANSPORT_VARIABLE) == "httpx" else "fast"
    return create_app(
        Settings(
            workers=[WorkerSpec(url=upstream, models=["stub-model"])],
            upstream_client=UpstreamClientConfig(transport=transport),
        )
    )


def static_app_factory() -> Litestar:
    """The server, Litestar and telemetry layers alone: one ASGI route that answers at once,
    without an upstream call (to see what the layers around the request path cost)."""
    return _static_app(with_telemetry=True)


def framework_app_factory() -> Litestar:
    """`static_app_factory` without the telemetry middleware."""
    return _static_app(with_telemetry=False)


async def bare_app(scope: Scope, receive: Receive, send: Send) -> None:
    """A plain ASGI callable answering every request at once: the server's own cost."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": _STATIC_HEADERS})
    await send({"type": "http.response.body", "body": COMPLETION})


def bare_app_factory() -> Any:
    return bare_app


def _static_app(*, with_telemetry: bool) -> Litestar:
    telemetry = Telemetry.from_settings(TelemetrySettings(), service_version="bench")

    @asgi("/v1/chat/completions", copy_scope=False)
    async def chat(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body", False):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": _STATIC_HEADERS})
        await send({"type": "http.response.body", "body": COMPLETION})

    @get("/health/ready", sync_to_thread=False)
    def ready() -> dict[str, str]:
        return {"status": "ready"}

    middleware = [telemetry.middleware] if with_telemetry else []
    return Litestar([chat, ready, telemetry.metrics_handler], middleware=middleware)


_STATIC_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(COMPLETION)).encode())]


APPS: dict[str, Callable[[], Any]] = {
    "gateway": app_factory,
    "static": static_app_factory,
    "framework": framework_app_factory,
    "bare": bare_app_factory,
}
"""What can stand behind the server: the gateway, or the layers around it without an upstream call."""


def use_client(client: str) -> None:
    """Choose the gateway's upstream transport: `fast` or `httpx` through the setting; the
    `asyncio-backend` experiment puts httpcore on `asyncio_backend.AsyncioBackend` in its place."""
    os.environ[TRANSPORT_VARIABLE] = "httpx" if client == "httpx" else "fast"
    if client == "asyncio-backend":
        upstream_client.FastTransport = fast_transport  # type: ignore[attr-defined,assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("uvicorn", "granian"), required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--app", choices=tuple(APPS), default="gateway")
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="fast",
        help="the upstream client's transport: adapters.http_transport (the default), httpx's own "
        "(httpcore), or httpcore on asyncio_backend",
    )
    parser.add_argument(
        "--count-calls",
        metavar="FILE",
        help="uvicorn only: count Python function calls while serving (cProfile); the total goes to FILE, "
        "the profile to FILE.pstats",
    )
    args = parser.parse_args()
    use_client(args.client)
    os.environ[UPSTREAM_VARIABLE] = args.upstream
    factory = APPS[args.app]
    if args.server == "uvicorn":
        import uvicorn

        app = factory()
        profile = cProfile.Profile() if args.count_calls else None
        if profile is not None:
            profile.enable()
        try:
            uvicorn.run(
                app,
                host="127.0.0.1",
                port=args.port,
                loop="uvloop",
                http="httptools",
                log_level="warning",
                access_log=False,
                server_header=False,
                lifespan="on",
            )
        finally:
            if profile is not None:
                profile.disable()
                calls = sum(stat[1] for stat in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined,assignment]
                Path(args.count_calls).write_text(f"{calls}\n")
                profile.dump_stats(f"{args.count_calls}.pstats")  # for a per-module breakdown
    else:
        from granian import Granian
        from granian.constants import Interfaces, Loops

        Granian(
            f"benchmarks.overhead.serve:{factory.__name__}",
            factory=True,
            address="127.0.0.1",
            port=args.port,
            interface=Interfaces.ASGI,
            loop=Loops.uvloop,
            workers=1,
            runtime_threads=1,
            log_access=False,
            log_level="warning",  # type: ignore[arg-type]
        ).serve()


if __name__ == "__main__":
    main()
