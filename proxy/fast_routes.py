"""The two generation routes served in front of Litestar, for `radixgate serve`.

`POST /v1/chat/completions` and `POST /v1/completions` are plain ASGI handlers already
(`proxy.routes.generation`); Litestar only routes to them and turns their exceptions into
responses. `FastRoutes` does both itself for these two paths: one dict lookup, the same telemetry
middleware (SERVER span, Prometheus series; the route template is the path), and the same
OpenAI-shaped errors (`proxy.errors`). Anything else (other paths, other methods on these paths,
lifespan) goes to the Litestar app unchanged. On the request path of a forwarded answer, Litestar's
router and exception middleware were ~9% of the gateway's CPU (`benchmarks/RESULTS.md`, "## overhead").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from litestar import Litestar
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from adapters.errors import EngineError
from proxy.asgi_types import Receive, Scope, Send, tracking_status
from proxy.errors import JSON, ApiError, ErrorDetail, encode_error, engine_error_detail
from proxy.gateway import Gateway
from proxy.routes.generation import CHAT_PATH, COMPLETIONS_PATH, handle_generation

logger = logging.getLogger("radixgate.errors")

_INTERNAL = ErrorDetail(message="The gateway hit an internal error.", type="server_error")


def with_fast_routes(
    app: Any, *, trusted_proxies: list[str] | str | None = None, access_log: bool = False
) -> Any:
    """`FastRoutes(app)` for a gateway's Litestar app (`proxy.app.create_app`); any other ASGI app as is.

    `trusted_proxies` (uvicorn's `forwarded_allow_ips`; run uvicorn with `proxy_headers=False` then):
    the `X-Forwarded-For`/`-Proto` headers those hosts send are applied here instead of in front of
    every request: to whatever Litestar serves, and to the generation routes only where something
    reads the client or scheme they set: recorded SERVER spans (`url.scheme`) or, with `access_log`,
    uvicorn's access log line. uvicorn's middleware was ~100 of a forwarded request's ~4,500 bytecodes.
    """
    state = getattr(app, "state", None)
    if isinstance(app, Litestar) and state is not None and "gateway" in state:
        return FastRoutes(app, trusted_proxies, access_log)
    return app


class FastRoutes:
    """An ASGI app: the generation routes directly, everything else through `app`."""

    __slots__ = ("_app", "_routes", "direct_routes")

    def __init__(
        self, app: Litestar, trusted_proxies: list[str] | str | None = None, access_log: bool = False
    ) -> None:
        gateway: Gateway = app.state.gateway
        forwarded = _forwarding(trusted_proxies)
        self._app = forwarded(app)
        middleware = gateway.telemetry.middleware
        self._routes: dict[str, Any] = {}
        for path, operation in ((CHAT_PATH, "chat"), (COMPLETIONS_PATH, "text_completion")):
            route = middleware(app=_Generation(gateway, operation))
            self._routes[path] = forwarded(route) if access_log or route.tracing else route
        self.direct_routes: dict[bytes, Any] = {path.encode(): route for path, route in self._routes.items()}
        """The routes by raw path, for a server that dispatches plain requests itself
        (`proxy.server_protocol.GatewayHttpProtocol`); the route template is then set by that server."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self._routes.get(scope["path"])
            if route is not None:
                scope["path_template"] = scope["path"]  # what Litestar sets for the telemetry's route label
                await route(scope, receive, send)
                return
        await self._app(scope, receive, send)


def _forwarding(trusted_proxies: list[str] | str | None) -> Callable[[Any], Any]:
    """What wraps an ASGI app so that it sees the client and scheme the trusted proxies forwarded."""
    if trusted_proxies is None:
        return lambda app: app
    return lambda app: ProxyHeadersMiddleware(app, trusted_hosts=trusted_proxies)


class _Generation:
    """One generation route with the error handling Litestar's exception handlers give the others."""

    __slots__ = ("_gateway", "_operation")

    def __init__(self, gateway: Gateway, operation: Any) -> None:
        self._gateway = gateway
        self._operation = operation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response, send = tracking_status(scope, send)  # to know whether an error can still be answered
        try:
            await handle_generation(self._gateway, self._operation, scope, receive, send)
        except ApiError as exc:
            await _answer(response.status != 0, send, exc.status, exc.detail, exc.headers)
        except EngineError as exc:
            await _answer(response.status != 0, send, exc.status, engine_error_detail(exc), None)
        except Exception as exc:
            if response.status:
                raise
            logger.error("unhandled error", exc_info=exc)
            await _answer(False, send, 500, _INTERNAL, None)


async def _answer(
    started: bool, send: Send, status: int, detail: ErrorDetail, headers: dict[str, str] | None
) -> None:
    """The error as an OpenAI-shaped JSON response; after the response has started, nothing can be
    said any more (the handlers end streams with an error event themselves)."""
    if started:
        logger.warning("error after the response started: %s", detail.message)
        return
    body = encode_error(detail)
    head = [(b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode())]
    head += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
