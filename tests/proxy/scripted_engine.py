"""An in-process `Engine` for unit tests of the request path: each call takes the next scripted step."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from adapters.base import Completion, EngineRequest
from adapters.errors import EngineError
from adapters.schema import probe_response
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.routing.pool import WorkerPool

BODY = (
    b'{"id":"cmpl-1","model":"m","choices":[{"index":0,"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
)
CHUNKS = [
    b'{"id":"c-1","model":"m","choices":[{"index":0,"delta":{"content":"a"}}]}',
    b'{"id":"c-1","model":"m","choices":[{"index":0,"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}',
]


@dataclass
class ScriptedEngine:
    """Answers BODY / CHUNKS unless the next scripted item is an error (raised before the first
    chunk) or a pair (chunks to send, then an error raised mid-stream)."""

    name: str = "engine"
    provider_name: str = "openai"
    server_address: str = "127.0.0.1"
    server_port: int | None = 9
    script: deque[EngineError | tuple[int, EngineError]] = field(default_factory=deque)
    healthy: bool = True
    calls: list[EngineRequest] = field(default_factory=list)
    closed_streams: int = 0
    closed: bool = False
    hang: bool = False

    async def complete(self, request: EngineRequest) -> Completion:
        self.calls.append(request)
        if self.hang:
            await asyncio.sleep(3600)
        if self.script:
            step = self.script.popleft()
            raise step if isinstance(step, EngineError) else step[1]
        probe = probe_response(BODY)
        return Completion(BODY, probe.usage, probe.id, probe.model, ["stop"])

    async def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        self.calls.append(request)
        step = self.script.popleft() if self.script else None
        try:
            if isinstance(step, EngineError):
                raise step
            for sent, chunk in enumerate(CHUNKS):
                if isinstance(step, tuple) and sent == step[0]:
                    raise step[1]
                yield chunk
        finally:
            self.closed_streams += 1

    async def check_health(self) -> bool:
        return self.healthy

    async def aclose(self) -> None:
        self.closed = True


def scripted_pool(engines: list[ScriptedEngine], model: str = "m") -> WorkerPool:
    """A round-robin worker pool over `engines` (worker ids are the engines' names)."""
    by_id = {engine.name: engine for engine in engines}
    specs = [
        WorkerSpec(url=f"http://{engine.name}.test", id=engine.name, models=[model]) for engine in engines
    ]
    return WorkerPool(
        [model], specs, RoutingSettings(policy="round_robin"), engine_factory=lambda spec: by_id[str(spec.id)]
    )
