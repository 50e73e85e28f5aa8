"""The test upstream's answers on its newer endpoints: `/v1/embeddings` and `/v1/responses`."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import numpy as np

EMBEDDING_DIMENSIONS = 8
"""Length of every vector the server returns (unless the request asks for `dimensions`)."""


def embedding_of(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """The vector the server returns for `text`: float32 values from its SHA-256, in [-1, 1)."""
    digest = hashlib.sha256(text.encode()).digest()
    values = np.frombuffer((digest * (1 + dimensions // 32))[:dimensions], dtype=np.uint8)
    return [float(v) for v in (values.astype(np.float32) / 128.0 - 1.0)]


MAX_DIMENSIONS = 4096
"""Longest vector the server makes (a fuzzer's `dimensions` may be any size)."""


def embeddings(body: dict[str, Any]) -> dict[str, Any]:
    """An embeddings list: one vector per input, `dimensions` long (at most MAX_DIMENSIONS)."""
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    dimensions = min(body.get("dimensions") or EMBEDDING_DIMENSIONS, MAX_DIMENSIONS)
    data = []
    for index, item in enumerate(inputs):
        vector = embedding_of(json.dumps(item) if not isinstance(item, str) else item, dimensions)
        encoded: Any = vector
        if body.get("encoding_format") == "base64":
            encoded = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(len(str(item).split()) for item in inputs)
    return {
        "object": "list",
        "data": data,
        "model": body["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def response(
    body: dict[str, Any], number: int, words: list[str], finish: str, cached_tokens: int
) -> dict[str, Any]:
    """A Responses API answer (`/v1/responses` served natively) made of `words`."""
    text = "".join(words)
    message = {
        "type": "message",
        "id": f"msg_up_{number}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": f"resp_up_{number}",
        "object": "response",
        "created_at": 1700000000 + number,
        "status": "completed" if finish == "stop" else "incomplete",
        "model": body.get("model"),
        "output": [message],
        "previous_response_id": body.get("previous_response_id"),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 5,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": len(words),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 5 + len(words),
        },
    }


def response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream of `response`, as OpenAI's Responses events."""
    message = response["output"][0]
    text = message["content"][0]["text"]
    where = {"item_id": message["id"], "output_index": 0, "content_index": 0}
    opened = {**response, "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opened},
        {"type": "response.output_item.added", "output_index": 0, "item": {**message, "content": []}},
        {"type": "response.content_part.added", **where, "part": {"type": "output_text", "text": ""}},
        {"type": "response.output_text.delta", **where, "delta": text, "logprobs": []},
        {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {"type": "response.completed", "response": response},
    ]
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]
