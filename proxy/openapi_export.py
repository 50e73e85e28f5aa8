"""The OpenAPI 3.1 description of the gateway, built from the same Structs the routes use.

`make openapi` writes it to `openapi.yaml`; `tests/proxy/test_openapi.py` fails when the file
and this builder disagree, or when the app serves a path or method the document does not list.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import msgspec

from adapters.schema import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from proxy import __version__
from proxy.cache.admin_routes import CACHE_CLEAR_PATH, CACHE_STATS_PATH, CACHE_WARM_PATH, ClearResult
from proxy.cache.cached_routes import CACHED_CHAT_PATH, CACHED_COMPLETIONS_PATH, CacheExtras
from proxy.cache.decorate import CacheStatsExtra, PerformanceExtra
from proxy.cache.stats import CacheStatsResponse
from proxy.cache.warm import WarmRequest, WarmResult
from proxy.errors import ErrorResponse
from proxy.responses import openapi as responses_openapi
from proxy.responses.routes import RESPONSES_PATH
from proxy.responses.schema import ResponsesRequest
from proxy.routes.generation import CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH
from proxy.routes.health import HEALTH_PATH, LIVE_PATH, READY_PATH
from proxy.routes.keys import CreatedKey, KeyList, NewKey, RevokedKey
from proxy.routes.models import MODELS_PATH
from proxy.routes.usage import ADMIN_USAGE_PATH, USAGE_PATH, TenantUsage, UsageList
from proxy.routing.admin import RemovedWorker, WorkerList, WorkerStatus
from proxy.routing.config import REMOTE_URL_PATTERN, WorkerSpec
from proxy.schemas import HealthStatus, LiveStatus, ModelList, ReadyStatus

METRICS_PATH = "/metrics"
ADMIN_WORKERS_PATH = "/admin/workers"
_REF = "#/components/schemas/{name}"
_SSE_STREAM = {
    "type": "string",
    "description": "Server-Sent Events exactly as OpenAI frames them: `data: {chunk}` and a blank line per "
    "chunk (each a GenerationChunk; one may be an error object), then `data: [DONE]`.",
    "pattern": r"^(data: [^\n]+\n\n)*data: \[DONE\]\n\n$",
}
_ERRORS = {
    "400": "Malformed JSON or an invalid field (`param` names it)",
    "401": "Missing or wrong API key (when keys are configured)",
    "403": "Not in the admin scope (a tenant key; off loopback without keys), or a worker host not allowed",
    "404": "Unknown model (`model_not_found`)",
    "405": "Wrong method",
    "409": "A worker with that id is already in the pool",
    "413": "Request body too large",
    "429": "The upstream's rate limit, relayed",
    "502": "Upstream unreachable or failed",
    "503": "No healthy worker, or the engine is overloaded",
    "504": "Upstream timeout",
}


def build_openapi() -> dict[str, Any]:
    """The whole document as plain data."""
    _, schemas = msgspec.json.schema_components(
        [
            ChatCompletionRequest,
            CompletionRequest,
            EmbeddingRequest,
            ResponsesRequest,
            ModelList,
            HealthStatus,
            ReadyStatus,
            LiveStatus,
            ErrorResponse,
            CacheExtras,
            CacheStatsExtra,
            PerformanceExtra,
            CacheStatsResponse,
            ClearResult,
            WarmRequest,
            WarmResult,
            WorkerList,
            WorkerSpec,
            WorkerStatus,
            RemovedWorker,
            TenantUsage,
            UsageList,
            NewKey,
            CreatedKey,
            KeyList,
            RevokedKey,
        ],
        ref_template=_REF,
    )
    # A worker added over HTTP is a remote engine: the embedded one is `[local_engine]`'s alone.
    worker = schemas["WorkerSpec"]["properties"]
    worker["kind"]["enum"] = [kind for kind in worker["kind"]["enum"] if kind != "local"]
    worker["url"]["pattern"] = REMOTE_URL_PATTERN
    # `POST /v1/cache/warm` needs something to warm (an empty body is a 400 naming `requests`).
    schemas["WarmRequest"]["anyOf"] = [
        {"required": [field], "properties": {field: {"minItems": 1}}} for field in ("requests", "prompts")
    ]
    responses_openapi.refine(schemas)
    extras = schemas["CacheExtras"]
    for request in ("ChatCompletionRequest", "CompletionRequest"):
        plain = schemas[request]
        # One object with both sets of fields: an `allOf` of two closed objects admits no instance.
        schemas["Cached" + request] = {
            **copy.deepcopy({k: v for k, v in plain.items() if k not in ("title", "additionalProperties")}),
            "description": "The OpenAI request plus the seed's cache extras (removed before forwarding).",
            "properties": copy.deepcopy({**plain["properties"], **extras["properties"]}),
        }
    schemas["GenerationChunk"] = {
        "type": "object",
        "description": "One event's data: OpenAI's chat.completion.chunk or text_completion object, or "
        '`{"error": ...}` when the stream fails after its start.',
    }
    schemas["GenerationResponse"] = {
        "type": "object",
        "description": "OpenAI's ChatCompletion or Completion object, relayed unchanged from the engine.",
        "required": ["id", "object", "created", "model", "choices"],
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "radixgate",
            "version": __version__,
            "description": "OpenAI-compatible gateway for self-hosted LLM engines. Request fields not listed "
            "here are accepted and reach OpenAI-compatible upstreams unchanged.",
        },
        "paths": {
            CHAT_PATH: {
                "post": _generation(
                    "createChatCompletion", "Create a chat completion", "ChatCompletionRequest"
                )
            },
            COMPLETIONS_PATH: {
                "post": _generation("createCompletion", "Create a text completion", "CompletionRequest")
            },
            EMBEDDINGS_PATH: {
                "post": {
                    **_get(
                        "createEmbedding",
                        "Create embeddings (workers that serve an embedding model)",
                        "EmbeddingList",
                        tuple(_ERRORS),
                    ),
                    "security": [{"apiKey": []}, {}],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("EmbeddingRequest")}},
                    },
                }
            },
            RESPONSES_PATH: {"post": _create_response()},
            RESPONSES_PATH + "/{response_id}": {
                "get": {
                    **_get("getResponse", "A stored response", "Response", ("401", "404")),
                    "parameters": [_RESPONSE_ID],
                },
                "delete": {
                    **_get("deleteResponse", "Delete a stored response", "DeletedResponse", ("401", "404")),
                    "parameters": [_RESPONSE_ID],
                },
            },
            RESPONSES_PATH + "/{response_id}/input_items": {
                "get": {
                    **_get(
                        "listInputItems",
                        "A stored response's input items, a page at a time",
                        "InputItemList",
                        ("400", "401", "404"),
                    ),
                    "parameters": [_RESPONSE_ID, *responses_openapi.INPUT_ITEMS_QUERY],
                }
            },
            CACHED_CHAT_PATH: {
                "post": _generation(
                    "createCachedChatCompletion",
                    "Chat completion with the cache extras: `cache_stats`, `performance`, `request_id`",
                    "CachedChatCompletionRequest",
                )
            },
            CACHED_COMPLETIONS_PATH: {
                "post": _generation(
                    "createCachedCompletion",
                    "Text completion with the cache extras: `cache_stats`, `performance`, `request_id`",
                    "CachedCompletionRequest",
                )
            },
            CACHE_STATS_PATH: {
                "get": _get(
                    "cacheStats", "Cache statistics from live counters", "CacheStatsResponse", ("401",)
                )
            },
            CACHE_CLEAR_PATH: {
                "post": _get(
                    "clearCache",
                    "Empty the response cache, routing trees and engine caches",
                    "ClearResult",
                    ("401", "403"),
                )
            },
            CACHE_WARM_PATH: {
                "post": {
                    **_get(
                        "warmCache", "Run requests to fill the caches", "WarmResult", ("400", "401", "403")
                    ),
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("WarmRequest")}},
                    },
                }
            },
            MODELS_PATH: {"get": _get("listModels", "List the models the gateway serves", "ModelList")},
            USAGE_PATH: {
                "get": _get("usage", "The caller's tenant's usage and budget", "TenantUsage", ("401",))
            },
            "/admin/keys": {
                "get": _get("listKeys", "Run-time API keys (never the keys)", "KeyList", ("401", "403")),
                "post": {
                    **_get(
                        "createKey",
                        "Create a key; it is shown in this answer only",
                        "CreatedKey",
                        ("400", "401", "403"),
                        status="201",
                    ),
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("NewKey")}},
                    },
                },
            },
            "/admin/keys/{key_id}": {
                "delete": {
                    **_get("revokeKey", "Revoke a run-time key", "RevokedKey", ("401", "403", "404")),
                    "parameters": [
                        {"name": "key_id", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                }
            },
            ADMIN_USAGE_PATH: {
                "get": _get("adminUsage", "Every tenant's usage and budget", "UsageList", ("401", "403"))
            },
            HEALTH_PATH: {"get": _get("health", "Gateway health, workers and memory", "HealthStatus")},
            READY_PATH: {
                "get": _get(
                    "ready", "200 when every model has a healthy worker", "ReadyStatus", errors=("503",)
                )
            },
            LIVE_PATH: {"get": _get("live", "200 while the process serves HTTP", "LiveStatus")},
            METRICS_PATH: {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics",
                    "responses": {
                        "200": {"description": "Prometheus text format", "content": {"text/plain": {}}}
                    },
                }
            },
            ADMIN_WORKERS_PATH: {
                "get": _get(
                    "listWorkers",
                    "Every worker: health, circuit, load, routing tree",
                    "WorkerList",
                    ("401", "403"),
                ),
                "post": {
                    **_get(
                        "addWorker",
                        "Add a worker while the gateway runs",
                        "WorkerStatus",
                        ("400", "401", "403", "409"),
                        status="201",
                    ),
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("WorkerSpec")}},
                    },
                },
            },
            ADMIN_WORKERS_PATH + "/{worker_id}": {
                "delete": {
                    **_get(
                        "removeWorker",
                        "Stop routing to a worker (202 while it drains)",
                        "RemovedWorker",
                        ("401", "403", "404"),
                    ),
                    "parameters": [
                        {"name": "worker_id", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                }
            },
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
    }


_RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}


def _create_response() -> dict[str, Any]:
    operation = {
        **_get("createResponse", "Create a model response", "Response", tuple(_ERRORS)),
        "security": [{"apiKey": []}, {}],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _ref("ResponsesRequest")}},
        },
    }
    answer = operation["responses"]["200"]
    answer["content"]["text/event-stream"] = {"schema": dict(responses_openapi.RESPONSES_SSE)}
    answer["links"] = {
        name: {"operationId": target, "parameters": {"response_id": "$response.body#/id"}}
        for name, target in (
            ("GetResponse", "getResponse"),
            ("DeleteResponse", "deleteResponse"),
            ("ListInputItems", "listInputItems"),
        )
    }
    return operation


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(name=name)}


def _error_responses(statuses: tuple[str, ...]) -> dict[str, Any]:
    return {
        status: {
            "description": _ERRORS[status],
            "content": {"application/json": {"schema": _ref("ErrorResponse")}},
        }
        for status in statuses
    }


def _generation(operation_id: str, summary: str, request: str) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "summary": summary,
        "security": [{"apiKey": []}, {}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {
            "200": {
                "description": "The completion as JSON, or with `stream: true` Server-Sent Events: "
                "`data: {chunk}` per chunk, then `data: [DONE]`; a failure after the first chunk "
                'is one `data: {"error": ...}` event before `[DONE]`.',
                "content": {
                    "application/json": {"schema": _ref("GenerationResponse")},
                    "text/event-stream": {
                        "schema": dict(_SSE_STREAM),
                        "x-event-data": _ref("GenerationChunk"),
                    },
                },
            },
            **_error_responses(tuple(_ERRORS)),
        },
    }


def _get(
    operation_id: str, summary: str, schema: str, errors: tuple[str, ...] = (), *, status: str = "200"
) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "summary": summary,
        "responses": {
            status: {"description": "OK", "content": {"application/json": {"schema": _ref(schema)}}},
            **_error_responses(errors),
        },
    }


def main() -> None:
    """Print the document as YAML (PyYAML comes with the `dev` extra)."""
    import yaml

    sys.stdout.write(yaml.safe_dump(build_openapi(), sort_keys=False, allow_unicode=True, width=100))


if __name__ == "__main__":
    main()
