"""One Responses request being served: its ids, its conversation, and the response object it makes."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from adapters.base import RouteHint
from proxy.errors import ErrorDetail
from proxy.responses.schema import ChatUsage, ResponsesRequest
from proxy.responses.store import StoredTurn
from proxy.responses.translate import Message, assistant_message

Call = tuple[str, str, str]
"""A function call: (call_id, name, arguments)."""
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}
"""Chat finish reasons that leave a response `incomplete`, and the reason it gives."""


def new_id(prefix: str) -> str:
    """An OpenAI-style id: `resp_...`, `msg_...`, `fc_...`, `call_...`."""
    return f"{prefix}_{secrets.token_hex(24)}"


@dataclass(slots=True)
class Turn:
    """What the route and the translating responder share about one request."""

    request: ResponsesRequest
    tenant_id: str
    history: list[Message]
    """The stored conversation that `previous_response_id` continues (empty without one)."""
    messages: list[Message]
    """This request's input as chat messages."""
    route: RouteHint = field(default_factory=RouteHint)
    input_items: list[dict[str, Any]] = field(default_factory=list)
    """The response's input items: the context it continues, then this request's input."""
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: ChatUsage | None = None,
        *,
        model: str | None = None,
        finish_reason: str | None = None,
        error: ErrorDetail | None = None,
    ) -> dict[str, Any]:
        """The response object (OpenAI's `Response`) in state `status`."""
        request = self.request
        text_format = request.text.format if request.text is not None and request.text.format else None
        reason = INCOMPLETE_REASONS.get(finish_reason or "")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": "incomplete" if status == "completed" and reason else status,
            "model": model or request.model,
            "output": output,
            "usage": None if usage is None else responses_usage(usage),
            "error": None if error is None else {"code": error.code or error.type, "message": error.message},
            "incomplete_details": {"reason": reason} if reason and status == "completed" else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "tools": request.tools or [],
            "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "text": {"format": text_format or {"type": "text"}},
            "previous_response_id": request.previous_response_id,
            "store": request.store,
            "metadata": request.metadata or {},
            "user": request.user,
            "truncation": "disabled",
        }

    def stored(self, response: bytes, text: str | None, calls: list[Call]) -> StoredTurn:
        """The row to store: the response (JSON), and the conversation with its output appended."""
        conversation = [*self.history, *self.messages, assistant_message(text, calls)]
        return StoredTurn(
            response,
            _encoder.encode(conversation),
            self.route.served_by,
            input_items=_encoder.encode(self.input_items),
        )


def responses_usage(usage: ChatUsage) -> dict[str, Any]:
    """Chat usage in the Responses form."""
    details = usage.prompt_tokens_details
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": (details.cached_tokens if details else None) or 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens or usage.prompt_tokens + usage.completion_tokens,
    }


_encoder = msgspec.json.Encoder()
