"""Responses requests as chat completions, and chat answers as Responses output items.

    input string                    one `user` message
    message items                   chat messages (`input_text`/`output_text` parts -> text, `input_image`
                                    -> `image_url`); `developer` and `system` keep their role
    function_call items             an assistant message's `tool_calls` (consecutive ones merged)
    function_call_output items      `tool` messages
    instructions                    a leading `system` message (not carried into follow-ups, as at OpenAI)
    max_output_tokens               `max_tokens`
    tools / tool_choice             function tools in chat's `{"type": "function", "function": ...}` form
    text.format                     `response_format` (`json_object`, `json_schema`)

A request the translation cannot represent (another tool type, an unknown item type) is a 400
naming the field, never a guess.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import ApiError
from proxy.responses.schema import ResponsesRequest, TextOptions

Message = dict[str, Any]

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def input_messages(items: str | list[dict[str, Any]]) -> list[Message]:
    """The chat messages of a request's `input`."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[Message] = []
    for index, item in enumerate(items):
        kind = _kind(item, "message")
        where = f"input[{index}]"
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": _text(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _text(item, "name", where),
                    "arguments": _text(item, "arguments", where),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_call_id" not in last:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = _join_text(output, f"{where}.output") if isinstance(output, list) else None
            if output is None:
                raise _invalid(f"{where}.output", "must be a string or a list of text parts")
            messages.append(
                {"role": "tool", "tool_call_id": _text(item, "call_id", where), "content": output}
            )
        else:
            raise _invalid(f"{where}.type", f"`{kind}` items cannot be translated to chat completions")
    return messages


def chat_body(request: ResponsesRequest, history: list[Message], turn: list[Message]) -> dict[str, Any]:
    """The chat completions request for `request`: instructions, the stored history, this turn."""
    messages = [*history, *turn]
    if request.instructions:
        messages.insert(0, {"role": "system", "content": request.instructions})
    if not messages:
        raise _invalid("input", "is empty; send at least one message")
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    for name in ("temperature", "top_p", "user", "parallel_tool_calls"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    if request.tools:
        body["tools"] = [_chat_tool(tool, index) for index, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(request.tool_choice)
    response_format = _response_format(request.text)
    if response_format is not None:
        body["response_format"] = response_format
    return body


def output_items(text: str | None, calls: list[tuple[str, str, str]], ids: list[str]) -> list[dict[str, Any]]:
    """Responses output items for an assistant's `text` and `(call_id, name, arguments)` calls; `ids`
    holds one item id per item (the message's first, when there is text)."""
    items: list[dict[str, Any]] = []
    if text:
        items.append(message_item(ids[0], text, "completed"))
    for item_id, (call_id, name, arguments) in zip(ids[len(items) :], calls, strict=True):
        items.append(function_call_item(item_id, call_id, name, arguments, "completed"))
    return items


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def assistant_message(text: str | None, calls: list[tuple[str, str, str]]) -> Message:
    """The chat message a follow-up's history holds for this response's output."""
    message: Message = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in calls
        ]
    return message


def _message(item: dict[str, Any], where: str) -> Message:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise _invalid(f"{where}.role", "must be one of `user`, `assistant`, `system`, `developer`")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise _invalid(f"{where}.content", "must be a string or a list of content parts")
    if role != "user" or all(_kind(p) in _TEXT_PARTS for p in content):
        return {"role": role, "content": _join_text(content, f"{where}.content")}
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        kind = _kind(part)
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": _text(part, "text", f"{where}.content[{index}]")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise _invalid(f"{where}.content[{index}].type", "is not a text or image part with a url")
    return {"role": role, "content": parts}


def _join_text(parts: list[Any], where: str) -> str:
    texts = []
    for index, part in enumerate(parts):
        if _kind(part) not in _TEXT_PARTS:
            raise _invalid(f"{where}[{index}].type", "must be a text part here")
        texts.append(_text(part, "text", f"{where}[{index}]"))
    return "".join(texts)


def _chat_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    where = f"tools[{index}]"
    if _kind(tool) != "function":
        raise _invalid(f"{where}.type", f"`{tool.get('type')}` tools are not served here; use `function`")
    function: dict[str, Any] = {"name": _text(tool, "name", where)}
    _copy_optional(tool, function, where, {"description": str, "parameters": dict, "strict": bool})
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise _invalid("tool_choice", "must be `auto`, `none`, `required` or a function")
        return choice
    if _kind(choice) != "function":
        raise _invalid("tool_choice.type", "only `function` tool choices are served here")
    return {"type": "function", "function": {"name": _text(choice, "name", "tool_choice")}}


def _response_format(text: TextOptions | None) -> dict[str, Any] | None:
    if text is None or text.format is None:
        return None
    kind = _kind(text.format)
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {"name": _text(text.format, "name", "text.format"), "schema": text.format.get("schema")}
        if not isinstance(schema["schema"], dict):
            raise _invalid("text.format.schema", "must be a JSON Schema object")
        _copy_optional(text.format, schema, "text.format", {"description": str, "strict": bool})
        return {"type": "json_schema", "json_schema": schema}
    raise _invalid("text.format.type", "must be `text`, `json_object` or `json_schema`")


def _copy_optional(
    source: dict[str, Any], target: dict[str, Any], where: str, kinds: dict[str, type]
) -> None:
    """Copy the optional fields `kinds` names from `source`, each of its type (None: absent)."""
    for name, kind in kinds.items():
        value = source.get(name)
        if value is None:
            continue
        if not isinstance(value, kind):
            raise _invalid(f"{where}.{name}", f"must be {_KIND_NAMES[kind]}")
        target[name] = value


_KIND_NAMES = {str: "a string", dict: "an object", bool: "a boolean"}


def _kind(item: Any, default: str | None = None) -> str | None:
    """An item's or part's `type` when it is a string (anything else matches no known type)."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type", default)
    return kind if isinstance(kind, str) else None


def _text(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise _invalid(f"{where}.{name}", "must be a string")
    return value


def _invalid(param: str, reason: str) -> ApiError:
    return ApiError(400, f"Invalid request: `{param}` {reason}.", param=param, code="invalid_value")
