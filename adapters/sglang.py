"""Adapter for an SGLang server: its OpenAI endpoints, plus its native API where that helps.

- Requests go to `/v1/chat/completions`, `/v1/completions` and `/v1/responses` (the client's body,
  byte for byte, with the tenant salt as `cache_salt`), except when the gateway has already
  tokenized the prompt (`EngineRequest.prompt_token_ids`) and the request needs nothing beyond plain
  sampling: then `POST /generate` with `input_ids` (salt as `extra_key`) skips SGLang's own template
  and tokenizer.
  `/generate` streams *cumulative* `text` (or increments with `--incremental-streaming-output`);
  the adapter turns it into OpenAI deltas, `meta_info.finish_reason` objects into finish reasons and
  `meta_info.cached_tokens` into `usage.prompt_tokens_details.cached_tokens`.
- `check_health` calls `/health_generate` (a real one-token generation when idle).
- `kv_capacity_tokens` reads `max_total_num_tokens` from `/server_info` (older: `/get_server_info`).
- `tokenizer_path` reads `tokenizer_path` (else `model_path`) from `/server_info`.
- `kv_events_advert` reads `kv_events_config` (`--kv-events-config`) from `/server_info`.
- `load` parses `/metrics` under both the `sglang:` and the newer `sglang_` prefix, with the
  speculative-decoding gauges when the server speculates (`adapters.spec_metrics`).
- `flush_cache` calls `/flush_cache`, which SGLang refuses (400) while requests run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec

from adapters.base import Completion, EngineRequest
from adapters.cache_salt import with_cache_salt
from adapters.engine_metrics import EngineLoad, parse_prometheus
from adapters.errors import EngineError, UpstreamStatusError
from adapters.kv_events_info import KvEventsAdvert, sglang_advert
from adapters.openai_compat import OpenAICompatEngine, UpstreamClientConfig, _transport_error, status_error
from adapters.sglang_native import NativeRequest, generate_body, native_request
from adapters.spec_metrics import sglang_speculation
from adapters.sse import DONE, SSEDecoder

_METRIC_SUFFIXES = ("num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate")


class SGLangEngine(OpenAICompatEngine):
    """One SGLang server (`python -m sglang.launch_server`)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        config: UpstreamClientConfig | None = None,
        native_generate: bool = True,
        health_path: str = "/health_generate",
    ) -> None:
        super().__init__(base_url, api_key=api_key, provider_name="sglang", config=config)
        root = base_url.rstrip("/")
        self._root = root.removesuffix("/v1")
        self._native_generate = native_generate
        self._health_path = health_path

    def __repr__(self) -> str:
        return f"SGLangEngine({self._root})"

    def _url(self, path: str) -> str:
        return self._root + path

    # ---- generation -------------------------------------------------------------------------

    async def complete(self, request: EngineRequest) -> Completion:
        native = self._native(request)
        if native is None:
            return await super().complete(_salted(request))
        try:
            response = await self._client.post(
                self._url("/generate"),
                content=generate_body(request, native),
                headers=request.trace_headers or None,
            )
        except httpx.HTTPError as exc:
            raise _transport(exc) from exc
        if response.status_code >= 300:
            raise status_error(response.status_code, response.content)
        return native.completion(response.content)

    async def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        native = self._native(request)
        if native is None:
            async for chunk in super().stream(_salted(request)):
                yield chunk
            return
        http_request = self._client.build_request(
            "POST",
            self._url("/generate"),
            content=generate_body(request, native, stream=True),
            headers=request.trace_headers or None,
        )
        try:
            response = await self._client.send(http_request, stream=True)
        except httpx.HTTPError as exc:
            raise _transport(exc) from exc
        try:
            if response.status_code >= 300:
                raise status_error(response.status_code, await response.aread())
            decoder = SSEDecoder()
            async for raw in response.aiter_bytes():
                for event in decoder.feed(raw):
                    if event.data == DONE:
                        return
                    for chunk in native.stream_chunks(event.data):
                        yield chunk
        except httpx.HTTPError as exc:
            raise _transport(exc, mid_stream=True) from exc
        finally:
            await response.aclose()

    def _native(self, request: EngineRequest) -> NativeRequest | None:
        if not self._native_generate or request.prompt_token_ids is None:
            return None
        return native_request(request)

    # ---- engine introspection ---------------------------------------------------------------

    async def check_health(self) -> bool:
        """True when `/health_generate` (or the configured path) answers 200."""
        try:
            response = await self._client.get(
                self._url(self._health_path), timeout=self.config.health_timeout_s
            )
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def server_info(self) -> dict[str, Any]:
        """`/server_info`, or `/get_server_info` on servers that predate it."""
        for path in ("/server_info", "/get_server_info"):
            response = await self._get(path)
            if response.status_code == 404:
                continue
            if response.status_code != 200:
                raise status_error(response.status_code, response.content)
            info = msgspec.json.decode(response.content)
            if isinstance(info, dict):
                return info
            raise EngineError(f"SGLang {path} is not a JSON object")
        raise UpstreamStatusError(404, "SGLang has neither /server_info nor /get_server_info")

    async def kv_capacity_tokens(self) -> int | None:
        """`max_total_num_tokens` of the server (top level, or in its first `internal_states`)."""
        info = await self.server_info()
        value = info.get("max_total_num_tokens")
        states = info.get("internal_states")
        if value is None and isinstance(states, list) and states and isinstance(states[0], dict):
            value = states[0].get("max_total_num_tokens")
        return int(value) if isinstance(value, int | float) and value > 0 else None

    async def tokenizer_path(self) -> str | None:
        """`tokenizer_path` (else `model_path`) of the server: where its tokenizer files lie."""
        info = await self.server_info()
        for key in ("tokenizer_path", "model_path"):
            value = info.get(key)
            if isinstance(value, str) and value:
                return value
        return None

    async def kv_events_advert(self) -> KvEventsAdvert | None:
        """The `--kv-events-config` the server runs with, when it publishes over ZMQ."""
        return sglang_advert(await self.server_info())

    async def load(self) -> EngineLoad:
        """Running and queued requests, token usage and cache hit rate from `/metrics`."""
        response = await self._get("/metrics")
        if response.status_code != 200:
            raise status_error(response.status_code, response.content)
        names = [f"{prefix}{suffix}" for prefix in ("sglang:", "sglang_") for suffix in _METRIC_SUFFIXES]
        found = parse_prometheus(response.text, names)

        def pick(suffix: str) -> float | None:
            value = found.get(f"sglang:{suffix}")
            return value if value is not None else found.get(f"sglang_{suffix}")

        return EngineLoad(
            running=pick("num_running_reqs"),
            waiting=pick("num_queue_reqs"),
            kv_usage=pick("token_usage"),
            cache_hit_rate=pick("cache_hit_rate"),
            speculation=sglang_speculation(response.text),
        )

    async def flush_cache(self) -> bool:
        """Ask SGLang to drop its radix cache; False when it refuses because requests are running."""
        try:
            response = await self._client.post(
                self._url("/flush_cache"), timeout=self.config.health_timeout_s
            )
        except httpx.HTTPError as exc:
            raise _transport(exc) from exc
        if response.status_code == 400:
            return False
        if response.status_code >= 300:
            raise status_error(response.status_code, response.content)
        return True

    async def tokenize(self, text: str) -> list[int]:
        """Token ids from SGLang's `/tokenize`."""
        response = await self._client.post(
            self._url("/tokenize"),
            content=msgspec.json.encode({"prompt": text, "add_special_tokens": False}),
            timeout=self.config.health_timeout_s,
        )
        if response.status_code != 200:
            raise status_error(response.status_code, response.content)
        return msgspec.json.decode(response.content, type=_TokenizeAnswer).tokens

    async def _get(self, path: str) -> httpx.Response:
        try:
            return await self._client.get(self._url(path), timeout=self.config.health_timeout_s)
        except httpx.HTTPError as exc:
            raise _transport(exc) from exc


class _TokenizeAnswer(msgspec.Struct):
    tokens: list[int]


def _salted(request: EngineRequest) -> EngineRequest:
    # Embeddings have no prefix KV. A Responses body passed through is salted like chat: the
    # worker's `/v1/responses` takes `cache_salt` too, so one tenant's prefix KV is never another's.
    if not request.cache_salt or request.operation == "embeddings":
        return request
    return dataclasses.replace(request, raw_body=with_cache_salt(request.raw_body, request.cache_salt))


def _transport(exc: httpx.HTTPError, *, mid_stream: bool = False) -> EngineError:
    # The same httpx-to-EngineError mapping as the OpenAI endpoints, so retries behave alike.
    return _transport_error(exc, mid_stream=mid_stream)
