"""The OpenAPI description of `/v1/responses` and `/v1/embeddings`, for `proxy.openapi_export`.

The request Structs give the plain fields; the item, tool and format shapes the translation reads
(`proxy.responses.translate`) are written out here, so what the schema admits the gateway accepts.
"""

from __future__ import annotations

from typing import Any

from proxy.responses.items import DEFAULT_LIMIT, INCLUDABLE, MAX_LIMIT

_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"enum": ["input_text", "output_text", "text"]}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_IMAGE_PART = {
    "type": "object",
    "properties": {"type": {"const": "input_image"}, "image_url": {"type": "string"}},
    "required": ["type", "image_url"],
}


def _message(roles: list[str], parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "type": {"const": "message"},
            "role": {"enum": roles},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": parts}}]},
        },
        "required": ["role", "content"],
    }


INPUT_ITEM = {
    "description": "A message (`type` may be left out), a `function_call` or a `function_call_output`.",
    "anyOf": [
        _message(["user"], [_TEXT_PART, _IMAGE_PART]),
        _message(["assistant", "system", "developer"], [_TEXT_PART]),
        {
            "type": "object",
            "properties": {
                "type": {"const": "function_call"},
                "call_id": {"type": "string"},
                "name": {"type": "string"},
                "arguments": {"type": "string"},
            },
            "required": ["type", "call_id", "name", "arguments"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "function_call_output"},
                "call_id": {"type": "string"},
                "output": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
            },
            "required": ["type", "call_id", "output"],
        },
    ],
}
FUNCTION_TOOL = {
    "type": "object",
    "properties": {
        "type": {"const": "function"},
        "name": {"type": "string"},
        "description": {"type": ["string", "null"]},
        "parameters": {"type": ["object", "null"]},
        "strict": {"type": ["boolean", "null"]},
    },
    "required": ["type", "name"],
}
TOOL_CHOICE = {
    "anyOf": [
        {"enum": ["auto", "none", "required"]},
        {
            "type": "object",
            "properties": {"type": {"const": "function"}, "name": {"type": "string"}},
            "required": ["type", "name"],
        },
        {"type": "null"},
    ]
}
TEXT_FORMAT = {
    "anyOf": [
        {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"]},
        {
            "type": "object",
            "properties": {
                "type": {"const": "json_schema"},
                "name": {"type": "string"},
                "schema": {"type": "object"},
                "description": {"type": ["string", "null"]},
                "strict": {"type": ["boolean", "null"]},
            },
            "required": ["type", "name", "schema"],
        },
        {"type": "null"},
    ]
}
INPUT_ITEMS_QUERY = [
    {
        "name": "order",
        "in": "query",
        "schema": {"enum": ["asc", "desc"], "default": "desc"},
        "description": "Oldest first (`asc`) or newest first.",
    },
    {
        "name": "after",
        "in": "query",
        "schema": {"type": "string"},
        "description": "An item id: the page starts after it.",
    },
    {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
    },
    {
        "name": "include",
        "in": "query",
        "schema": {"type": "array", "items": {"enum": sorted(INCLUDABLE)}},
        "description": "Fields to add: `message.input_image.image_url`, `message.output_text.logprobs`.",
    },
]
RESPONSES_SSE = {
    "type": "string",
    "description": "Server-Sent Events as OpenAI frames them: `event: {type}` then `data: {event}` per "
    "event, each with its `sequence_number`, ending with `response.completed`, `response.incomplete` "
    "or (after an `error` event) `response.failed`.",
    "pattern": r"^(event: [a-z_.]+\ndata: [^\n]+\n\n)+$",
}


def refine(schemas: dict[str, Any]) -> None:
    """Write the translated shapes into the Struct-made schemas, and add the answers' schemas."""
    request = schemas["ResponsesRequest"]["properties"]
    request["input"]["anyOf"][1]["items"] = INPUT_ITEM
    request["tools"]["anyOf"][0]["items"] = FUNCTION_TOOL
    request["tool_choice"] = {**TOOL_CHOICE, "default": None}
    schemas["TextOptions"]["properties"]["format"] = {**TEXT_FORMAT, "default": None}
    embedding = schemas["EmbeddingRequest"]["properties"]
    # Embeddings are never streamed, and their input is never empty.
    embedding["stream"] = {"const": False, "default": False}
    embedding["input"]["anyOf"][0]["minLength"] = 1
    embedding["input"]["anyOf"][1]["minItems"] = 1
    schemas["Response"] = {
        "type": "object",
        "description": "OpenAI's Response object; `usage.input_tokens_details.cached_tokens` is the prompt "
        "tokens the engine served from its prefix cache.",
        "required": ["id", "object", "created_at", "status", "model", "output"],
    }
    schemas["InputItemList"] = {
        "type": "object",
        "description": "A page of a response's input items (the whole context it answered), each with its "
        "`id`: OpenAI's list object.",
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"type": "object", "required": ["id", "type"]}},
            "first_id": {"type": ["string", "null"]},
            "last_id": {"type": ["string", "null"]},
            "has_more": {"type": "boolean"},
        },
        "required": ["object", "data", "first_id", "last_id", "has_more"],
    }
    schemas["DeletedResponse"] = {
        "type": "object",
        "properties": {"id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}},
        "required": ["id", "object", "deleted"],
    }
    schemas["EmbeddingList"] = {
        "type": "object",
        "description": "OpenAI's embeddings list, relayed unchanged from the worker.",
        "required": ["object", "data", "model"],
    }
