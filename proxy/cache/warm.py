"""`POST /v1/cache/warm`: fill the caches ahead of traffic by running requests through the engines.

A response cache cannot invent answers, so warming means running real requests:

- `requests`: whole chat or text-completion bodies (chat when the body has `messages`), answered as
  JSON (`stream` is dropped). Each runs through routing and the engine, which leaves its prompt's
  KV in the engine's prefix cache and the prompt in the routing tree. A deterministic answer
  (temperature 0 or a seed; see `cachelayer.responses`) is also stored in the caller's response
  cache, in the JSON form (a later *streamed* identical request is a different entry and misses);
  one already stored is not run again.
- `prompts` (with `model`): prefix-only warming: each prompt runs as a one-token greedy text
  completion whose answer is not stored, so only the engine's prefix cache and the routing tree fill.

Items run at most `WARM_CONCURRENCY` at a time, as the caller's tenant (its cache salt), and each gets
its own result; one failing item does not stop the others.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Literal

import msgspec

from adapters.base import EngineRequest
from adapters.errors import EngineError
from adapters.schema import Operation
from cachelayer.responses import StoredResponse, is_deterministic
from proxy.auth import Tenant
from proxy.cache.answers import complete_answer
from proxy.errors import ApiError, ErrorDetail, engine_error_detail
from proxy.gateway import Gateway
from proxy.pipeline import admit, decode_body

MAX_WARM_ITEMS = 256
"""Requests plus prompts accepted in one call."""
WARM_CONCURRENCY = 4
"""Items in flight at once (enough for an engine to batch, few enough to leave room for traffic)."""

WarmStatus = Literal["stored", "already_cached", "prefilled", "error"]


class WarmRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of `POST /v1/cache/warm`."""

    requests: list[dict[str, Any]] = msgspec.field(default_factory=list)
    """Whole chat or text-completion request bodies."""
    model: str | None = None
    """The model for `prompts`; may be left out when the gateway serves one model."""
    prompts: list[str] = msgspec.field(default_factory=list)
    """Prompts to prefill (one-token completions, answers not stored)."""


class WarmItem(msgspec.Struct, kw_only=True):
    index: int
    """Position in `requests`, then in `prompts`."""
    kind: Literal["request", "prompt"]
    status: WarmStatus
    """`stored` (ran, answer cached), `already_cached` (not run), `prefilled` (ran, answer not
    cached: sampled, or a prompt), `error`."""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    """Prompt tokens the engine reported already cached when it ran this item."""
    error: ErrorDetail | None = None


class WarmResult(msgspec.Struct, kw_only=True):
    warmed: int
    """Items that ran or were already cached."""
    failed: int
    results: list[WarmItem]


async def warm(gateway: Gateway, tenant: Tenant, body: WarmRequest) -> WarmResult:
    """Run every item of `body` (see the module docstring)."""
    if not body.requests and not body.prompts:
        raise ApiError(
            400,
            "Nothing to warm: send `requests` (whole chat or completion bodies) and/or `prompts` "
            "with `model`.",
            param="requests",
            code="missing_items",
        )
    if len(body.requests) + len(body.prompts) > MAX_WARM_ITEMS:
        raise ApiError(400, f"At most {MAX_WARM_ITEMS} requests and prompts per call.", code="too_many_items")
    model = body.model
    if body.prompts and model is None:
        served = gateway.router.model_ids()
        if len(served) != 1:  # which model would be a guess
            raise ApiError(400, "`model` is required with `prompts`.", param="model", code="missing_model")
        model = served[0]
    items: list[tuple[str, dict[str, Any]]] = [("request", request) for request in body.requests]
    items += [("prompt", prefill_body(model or "", prompt)) for prompt in body.prompts]
    limit = asyncio.Semaphore(WARM_CONCURRENCY)

    async def run(index: int, kind: str, fields: dict[str, Any]) -> WarmItem:
        async with limit:
            return await warm_one(gateway, tenant, index, kind == "prompt", fields)

    results = await asyncio.gather(*(run(i, kind, fields) for i, (kind, fields) in enumerate(items)))
    failed = sum(item.status == "error" for item in results)
    return WarmResult(warmed=len(results) - failed, failed=failed, results=list(results))


def prefill_body(model: str, prompt: str) -> dict[str, Any]:
    """A prompt as a one-token greedy text completion (it fills the prefix caches only)."""
    return {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}


async def warm_one(
    gateway: Gateway, tenant: Tenant, index: int, prefill_only: bool, fields: dict[str, Any]
) -> WarmItem:
    """Run one item (a prompt's prefill body when `prefill_only`) and say what became of it."""
    kind: Literal["request", "prompt"] = "prompt" if prefill_only else "request"
    fields = {name: value for name, value in fields.items() if name not in ("stream", "stream_options")}
    operation: Operation = "chat" if "messages" in fields else "text_completion"
    raw = msgspec.json.encode(fields)
    try:
        params, raw = decode_body(operation, raw)
        raw = admit(gateway, tenant, params, raw)
    except ApiError as exc:
        return WarmItem(index=index, kind=kind, status="error", error=exc.detail)
    request = EngineRequest(operation, params, raw, uuid.uuid4().hex, tenant.id, tenant.cache_salt)
    step = gateway.cache
    key = (
        None
        if prefill_only or not is_deterministic(params.temperature, params.seed)
        else step.key_for(request)
    )
    if key is not None and await step.get(key) is not None:
        return WarmItem(index=index, kind=kind, status="already_cached")
    try:
        completion = await gateway.forwarder.complete(request)
    except EngineError as exc:
        return WarmItem(index=index, kind=kind, status="error", error=engine_error_detail(exc))
    usage = completion.usage
    status: WarmStatus = "prefilled"
    tokens = complete_answer([completion.body]) if key is not None else None
    if (
        key is not None
        and tokens is not None
        and await step.put(key, StoredResponse.json_body(completion.body, *tokens))
    ):
        status = "stored"
    return WarmItem(
        index=index,
        kind=kind,
        status=status,
        prompt_tokens=usage.prompt_tokens if usage is not None else None,
        cached_tokens=usage.cached_tokens if usage is not None else None,
    )
