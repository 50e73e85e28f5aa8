"""The Responses API request as radixgate reads it (msgspec), and the small chat probes it reads back.

Fields that cannot change a chat-completions answer (`include`, `truncation`, `reasoning`,
`service_tier`, ...) are not decoded: like any unknown field they are ignored when the request is
translated, and reach a worker that serves `/v1/responses` itself unchanged (docs/responses.md).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from adapters.schema import TokenCount

MAX_INPUT_ITEMS = 4096
"""Most input items one request may carry (as many as chat messages)."""
MAX_TOOLS = 128


class TextOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    """`text`: the output's format (`text`, `json_object` or `json_schema`)."""

    format: dict[str, Any] | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """`POST /v1/responses`."""

    model: str
    input: str | Annotated[list[dict[str, Any]], msgspec.Meta(min_length=1, max_length=MAX_INPUT_ITEMS)]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    tools: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    store: bool = True
    stream: bool = False
    user: str | None = None
    metadata: dict[str, str] | None = None


# ---- what is read back from a chat completion ----------------------------------------------------


class FunctionProbe(msgspec.Struct, kw_only=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallProbe(msgspec.Struct, kw_only=True):
    index: int = 0
    id: str | None = None
    function: FunctionProbe | None = None


class MessageProbe(msgspec.Struct, kw_only=True):
    content: str | None = None
    tool_calls: list[ToolCallProbe] | None = None


class ChatChoiceProbe(msgspec.Struct, kw_only=True):
    index: int = 0
    message: MessageProbe | None = None
    delta: MessageProbe | None = None
    finish_reason: str | None = None


class ChatUsageDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int | None = None


class ChatUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: ChatUsageDetails | None = None


class ChatProbe(msgspec.Struct, kw_only=True):
    """A chat completion body or stream chunk, as far as the Responses translation reads it."""

    model: str | None = None
    choices: list[ChatChoiceProbe] = msgspec.field(default_factory=list)
    usage: ChatUsage | None = None


chat_probe = msgspec.json.Decoder(ChatProbe)
