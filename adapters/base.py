"""The one interface between the proxy and every engine.

The proxy builds an `EngineRequest` and calls `Engine.complete` (one JSON body back) or
`Engine.stream` (an async iterator of JSON chunk payloads, without SSE framing). The proxy
never knows which engine it talks to; an adapter never knows about HTTP routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from adapters.schema import Operation, RequestParams, Usage


@dataclass(slots=True)
class RouteHint:
    """A front door's say in where a request runs, and where it ran."""

    prefer_worker: str | None = None
    """A worker to keep the request on while its load allows (the one that served the previous
    turn of a conversation holds its KV)."""
    required: bool = False
    """Only `prefer_worker` may serve it (it holds the conversation's state, not only its KV)."""
    served_by: str | None = None
    """The worker the last attempt was sent to, set by the forwarder."""


@dataclass(slots=True)
class EngineRequest:
    """One generation request as it crosses from the proxy into an adapter."""

    operation: Operation
    params: RequestParams
    """The fields radixgate understands, decoded and validated."""
    raw_body: bytes
    """Exactly what the client sent; unknown fields reach OpenAI-compatible upstreams from here."""
    request_id: str
    tenant_id: str
    cache_salt: str
    """Set by the gateway from the tenant, never by the client; salts every cache key and tree."""
    trace_headers: Mapping[str, str] = field(default_factory=dict)
    """W3C trace-context headers to propagate upstream (`traceparent`, `tracestate`)."""
    prompt_token_ids: list[int] | None = None
    """Token ids of the (chat-templated) prompt when the gateway has tokenized it."""
    route: RouteHint | None = None
    """The front door's routing hint (None: the policy alone decides)."""
    speculation: bool | None = None
    """`enable_speculation` of a `/v1/cached/*` request; None: the engine's own default."""
    sliding_window: bool | None = None
    """`enable_sliding_window` of a `/v1/cached/*` request: attend with the engine's sliding window
    (engines that have one); None: the engine's default (`[sliding_window] enabled`)."""

    @property
    def model(self) -> str:
        return self.params.model

    @property
    def stream(self) -> bool:
        return self.params.stream


@dataclass(slots=True)
class Completion:
    """A whole non-streaming answer: the OpenAI-shaped body and what the gateway reads from it."""

    body: bytes
    usage: Usage | None = None
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    """The finish reasons the body's choices carry (choices without one are left out)."""
    choices: int | None = None
    """How many choices the body holds, when the adapter counted them: the response cache then knows
    a body is complete (every choice finished) without decoding it again."""
    whole: bool = False
    """True when the body is complete by its kind (embeddings: no choices to finish)."""


@runtime_checkable
class Engine(Protocol):
    """What every adapter implements. One instance per worker (base URL or embedded engine)."""

    provider_name: str
    """`gen_ai.provider.name` for traces: "openai", "sglang", "vllm" or "radixgate.local"."""
    server_address: str
    server_port: int | None

    async def complete(self, request: EngineRequest) -> Completion:
        """Run a non-streaming request. Raises `adapters.errors.EngineError` on failure."""
        ...

    def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        """Yield each chunk's JSON payload (`{"id":..., "choices":[...]}`), without `data: ` framing
        and without the final `[DONE]`. Errors before the first chunk raise from the first
        `__anext__`; later ones raise mid-iteration. Closing the iterator cancels the work."""
        ...

    async def check_health(self) -> bool:
        """True when the engine can serve a request now."""
        ...

    async def aclose(self) -> None:
        """Release connections, threads and memory."""
        ...
