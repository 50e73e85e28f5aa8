"""Adapter for a vLLM server (`vllm serve`): its OpenAI endpoints and its operational ones.

- Requests go to `/v1/chat/completions`, `/v1/completions` and `/v1/responses` with the tenant salt
  as `cache_salt` (vLLM keeps salted requests' prefix blocks apart).
  `usage.prompt_tokens_details.cached_tokens` is relayed when vLLM reports it
  (`--enable-prompt-tokens-details`); when it does not, the cached count stays unknown (None),
  never zero.
- `tokenize` calls `POST /tokenize`; `flush_cache` calls `POST /reset_prefix_cache`;
  `tokenizer_path` is the model's `root` in `GET /v1/models`; `kv_events_advert` reads
  `kv_events_config` from `GET /server_info?config_format=json` (vLLM serves it only with
  `VLLM_SERVER_DEV_MODE=1`; otherwise its KV events are configured on the worker).
- `load` parses `/metrics`: `vllm:num_requests_running|waiting`, `vllm:kv_cache_usage_perc` (older:
  `vllm:gpu_cache_usage_perc`) and the hit rate from `vllm:prefix_cache_hits_total` over
  `vllm:prefix_cache_queries_total`; `kv_capacity_tokens` comes from the labels of
  `vllm:cache_config_info` (`num_gpu_blocks` x `block_size`); its spec-decode counters, when it
  speculates, come with the load (`adapters.spec_metrics`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator

import httpx
import msgspec

from adapters.base import Completion, EngineRequest
from adapters.cache_salt import with_cache_salt
from adapters.engine_metrics import EngineLoad, parse_prometheus
from adapters.kv_events_info import KvEventsAdvert, vllm_advert
from adapters.openai_compat import OpenAICompatEngine, UpstreamClientConfig, _transport_error, status_error
from adapters.spec_metrics import vllm_speculation

_LOAD_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)
_CACHE_CONFIG = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class VLLMEngine(OpenAICompatEngine):
    """One vLLM OpenAI-compatible server."""

    def __init__(
        self, base_url: str, *, api_key: str | None = None, config: UpstreamClientConfig | None = None
    ) -> None:
        super().__init__(base_url, api_key=api_key, provider_name="vllm", config=config)
        self._root = base_url.rstrip("/").removesuffix("/v1")

    def __repr__(self) -> str:
        return f"VLLMEngine({self._root})"

    async def complete(self, request: EngineRequest) -> Completion:
        return await super().complete(_salted(request))

    async def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        async for chunk in super().stream(_salted(request)):
            yield chunk

    async def check_health(self) -> bool:
        """True when vLLM's `/health` answers 200."""
        try:
            response = await self._client.get(self._root + "/health", timeout=self.config.health_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def tokenize(self, text: str) -> list[int]:
        """Token ids from vLLM's `/tokenize`."""
        body = msgspec.json.encode({"prompt": text, "add_special_tokens": False})
        response = await self._post("/tokenize", body)
        if response.status_code != 200:
            raise status_error(response.status_code, response.content)
        return msgspec.json.decode(response.content, type=_TokenizeAnswer).tokens

    async def tokenizer_path(self) -> str | None:
        """The served model's `root` in `/v1/models`: the directory vLLM loaded it and its tokenizer from."""
        try:
            response = await self._client.get(self._root + "/v1/models", timeout=self.config.health_timeout_s)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, mid_stream=False) from exc
        if response.status_code != 200:
            raise status_error(response.status_code, response.content)
        listing = msgspec.json.decode(response.content, type=_ModelRoots)
        return next((entry.root for entry in listing.data if entry.root), None)

    async def kv_events_advert(self) -> KvEventsAdvert | None:
        """`kv_events_config` from `/server_info` in JSON; None where vLLM does not serve it."""
        try:
            response = await self._client.get(
                self._root + "/server_info",
                params={"config_format": "json"},
                timeout=self.config.health_timeout_s,
            )
        except httpx.HTTPError as exc:
            raise _transport_error(exc, mid_stream=False) from exc
        if response.status_code == 404:  # not in dev mode
            return None
        if response.status_code != 200:
            raise status_error(response.status_code, response.content)
        info = msgspec.json.decode(response.content)
        return vllm_advert(info) if isinstance(info, dict) else None

    async def flush_cache(self) -> bool:
        """`POST /reset_prefix_cache`; False when vLLM refuses."""
        response = await self._post("/reset_prefix_cache", b"")
        if response.status_code in (400, 409):
            return False
        if response.status_code >= 300:
            raise status_error(response.status_code, response.content)
        return True

    async def load(self) -> EngineLoad:
        """Running and waiting requests, KV usage and prefix-cache hit rate from `/metrics`."""
        text = await self._metrics_text()
        found = parse_prometheus(text, _LOAD_METRICS)
        queries = found.get("vllm:prefix_cache_queries_total")
        hits = found.get("vllm:prefix_cache_hits_total")
        usage = found.get("vllm:kv_cache_usage_perc", found.get("vllm:gpu_cache_usage_perc"))
        return EngineLoad(
            running=found.get("vllm:num_requests_running"),
            waiting=found.get("vllm:num_requests_waiting"),
            kv_usage=usage,
            cache_hit_rate=hits / queries if queries and hits is not None else None,
            speculation=vllm_speculation(text),
        )

    async def kv_capacity_tokens(self) -> int | None:
        """`num_gpu_blocks * block_size` from the `vllm:cache_config_info` labels, if exported."""
        match = _CACHE_CONFIG.search(await self._metrics_text())
        if match is None:
            return None
        labels = dict(_LABEL.findall(match.group(1)))
        try:
            return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            return None

    async def _metrics_text(self) -> str:
        try:
            response = await self._client.get(self._root + "/metrics", timeout=self.config.health_timeout_s)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, mid_stream=False) from exc
        if response.status_code != 200:
            raise status_error(response.status_code, response.content)
        return response.text

    async def _post(self, path: str, body: bytes) -> httpx.Response:
        try:
            return await self._client.post(
                self._root + path, content=body, timeout=self.config.health_timeout_s
            )
        except httpx.HTTPError as exc:
            raise _transport_error(exc, mid_stream=False) from exc


class _TokenizeAnswer(msgspec.Struct):
    tokens: list[int]


class _ModelRoot(msgspec.Struct):
    root: str | None = None


class _ModelRoots(msgspec.Struct):
    data: list[_ModelRoot]


def _salted(request: EngineRequest) -> EngineRequest:
    # Embeddings have no prefix KV. A Responses body passed through is salted like chat: the
    # worker's `/v1/responses` takes `cache_salt` too, so one tenant's prefix KV is never another's.
    if not request.cache_salt or request.operation == "embeddings":
        return request
    return dataclasses.replace(request, raw_body=with_cache_salt(request.raw_body, request.cache_salt))
