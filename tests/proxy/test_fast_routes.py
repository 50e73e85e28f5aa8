"""`FastRoutes`: the generation routes in front of Litestar answer as Litestar's would, errors included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from adapters.errors import UpstreamTimeout
from proxy.app import create_app
from proxy.asgi_types import Message
from proxy.fast_routes import FastRoutes, with_fast_routes
from proxy.settings import Settings
from tests.proxy.scripted_engine import BODY, ScriptedEngine, scripted_pool

REQUEST = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def call(
    app: Any, method: str, path: str, body: bytes = b"", scope_out: dict[str, Any] | None = None
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One HTTP request through the ASGI app: (status, headers, body); `scope_out` gets the scope as the
    app left it (with `extra_headers` added to the request's headers first)."""
    scope_out = {} if scope_out is None else scope_out
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *scope_out.pop("extra_headers", []),
        ],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 5000),
        "root_path": "",
        "asgi": {"version": "3.0"},
    }
    sent: list[Message] = []
    received = False

    async def receive() -> Message:
        nonlocal received
        if received:  # the client stays connected: a server says nothing more
            await asyncio.Event().wait()
        received = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    scope_out.update(scope)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), content


def fast_app(engine: ScriptedEngine) -> FastRoutes:
    app = with_fast_routes(create_app(Settings(), router=scripted_pool([engine])))
    assert isinstance(app, FastRoutes)
    return app


async def test_a_generation_request_is_answered_directly() -> None:
    engine = ScriptedEngine()
    status, headers, body = await call(fast_app(engine), "POST", "/v1/chat/completions", REQUEST)
    assert (status, body, headers[b"content-type"]) == (200, BODY, b"application/json")
    assert len(engine.calls) == 1


async def test_errors_are_openai_shaped() -> None:
    engine = ScriptedEngine()
    engine.script.append(UpstreamTimeout("The upstream did not answer in time."))
    app = fast_app(engine)
    cases = [
        (REQUEST, 504, "The upstream did not answer in time."),
        (b"{not json", 400, None),
        (json.dumps({"model": "nope", "messages": []}).encode(), 404, None),
    ]
    for body, expected, message in cases:
        status, headers, content = await call(app, "POST", "/v1/chat/completions", body)
        error = json.loads(content)["error"]
        assert status == expected and headers[b"content-type"] == b"application/json"
        assert set(error) == {"message", "type", "param", "code"}
        assert message is None or error["message"] == message


async def test_an_unexpected_exception_is_a_500_not_a_dropped_connection() -> None:
    engine = ScriptedEngine()

    async def broken(request: Any) -> Any:
        raise RuntimeError("bug")

    engine.complete = broken  # type: ignore[method-assign]
    status, _, content = await call(
        fast_app(engine), "POST", "/v1/completions", b'{"model":"m","prompt":"x"}'
    )
    assert status == 500 and json.loads(content)["error"]["type"] == "server_error"


async def test_other_methods_and_paths_go_through_litestar() -> None:
    app = fast_app(ScriptedEngine())
    status, headers, content = await call(app, "GET", "/v1/chat/completions")
    assert status == 405 and headers[b"allow"] == b"POST"
    assert json.loads(content)["error"]["code"] == "method_not_allowed"
    status, _, content = await call(app, "GET", "/v1/nowhere")
    assert status == 404 and json.loads(content)["error"]["code"] == "unknown_url"


def test_a_plain_asgi_app_is_left_alone() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        del scope, receive, send

    assert with_fast_routes(app) is app


async def test_trusted_proxies_forwarded_headers_reach_litestar_and_the_access_log_only() -> None:
    """With `trusted_proxies` (uvicorn's proxy headers off), Litestar's requests see the forwarded
    client; a generation request without a span or access log is not rewritten (nothing reads it)."""
    forwarded = [(b"x-forwarded-for", b"203.0.113.7"), (b"x-forwarded-proto", b"https")]

    def app(access_log: bool) -> Any:
        return with_fast_routes(
            create_app(Settings(), router=scripted_pool([ScriptedEngine()])),
            trusted_proxies="127.0.0.1",
            access_log=access_log,
        )

    for access_log, path, method, rewritten in [
        (False, "/v1/nowhere", "GET", True),
        (False, "/v1/chat/completions", "POST", False),
        (True, "/v1/chat/completions", "POST", True),
    ]:
        seen: dict[str, Any] = {"extra_headers": forwarded}
        await call(app(access_log), method, path, REQUEST if method == "POST" else b"", seen)
        expected = (("203.0.113.7", 0), "https") if rewritten else (("127.0.0.1", 5000), "http")
        assert (seen["client"], seen["scheme"]) == expected, (access_log, path)
