"""Fakes shared by the routing tests: an in-memory engine and request builders."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from adapters.base import Completion, EngineRequest
from adapters.schema import ChatCompletionRequest, ChatMessage, CompletionRequest
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.routing.pool import WorkerPool


class FakeEngine:
    """Answers instantly; `healthy` and `capacity` are set by the test."""

    provider_name = "fake"
    server_address = "127.0.0.1"
    server_port: int | None = None

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.healthy = True
        self.capacity: int | None = None
        self.closed = False

    async def complete(self, request: EngineRequest) -> Completion:
        return Completion(body=b"{}")

    async def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        yield b"{}"

    async def check_health(self) -> bool:
        return self.healthy

    async def kv_capacity_tokens(self) -> int | None:
        return self.capacity

    async def aclose(self) -> None:
        self.closed = True


def chat_request(system: str, user: str, *, salt: str = "", max_tokens: int | None = 64) -> EngineRequest:
    """A chat request whose prompt is `system` then `user`."""
    params = ChatCompletionRequest(
        model="m",
        messages=[ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)],
        max_tokens=max_tokens,
    )
    return EngineRequest(
        operation="chat",
        params=params,
        raw_body=msgspec.json.encode(params),
        request_id="r",
        tenant_id="t",
        cache_salt=salt,
    )


def completion_request(prompt: str, *, user: str | None = None) -> EngineRequest:
    params = CompletionRequest(model="m", prompt=prompt, max_tokens=16, user=user)
    return EngineRequest(
        operation="text_completion",
        params=params,
        raw_body=msgspec.json.encode(params),
        request_id="r",
        tenant_id="t",
        cache_salt="",
    )


def make_pool(count: int = 3, *, policy: str = "cache_aware", **settings: object) -> WorkerPool:
    specs = [
        WorkerSpec(kind="openai", url=f"http://127.0.0.1:{9000 + i}", id=f"w{i}", models=["m"])
        for i in range(count)
    ]
    return WorkerPool(
        ["m"],
        specs,
        msgspec.convert({"policy": policy, **settings}, RoutingSettings),
        engine_factory=FakeEngine,
    )


@pytest.fixture
def pool() -> WorkerPool:
    return make_pool()
