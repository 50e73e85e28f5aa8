"""Tool calls on the embedded engine: which functions a request may call, and how a call reads as
text (`adapters.local.call_parser` turns the model's text back into OpenAI `tool_calls`).

SmolLM2's chat template (the GGUF's `tokenizer.chat_template`) knows nothing of tools: it renders
every message as `<|im_start|>{role}\\n{content}<|im_end|>` and reads neither `tools` nor
`tool_calls`. For such a template the engine lists the tools in the system message itself and
writes every call, the history's and the model's own, in one text form (the Hermes style):

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

and a `tool` message's content as `<tool_response>{content}</tool_response>` (SmolLM2-135M, shown
a bare result, copies the call again; shown it wrapped, it answers with it). A template that reads
`tools` gets them, and each message's `tool_calls`, as `transformers` passes them. Either way the
grammar (`adapters.local.grammar`) holds the model's own calls to this form, so a call always
parses; with `tool_choice` `auto` an answer that starts with `<` is a call. With
`parallel_tool_calls` (the default) an answer may hold several calls back to back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from adapters.errors import InvalidRequest
from adapters.schema import ChatCompletionRequest

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESULT_OPEN = "<tool_response>"
RESULT_CLOSE = "</tool_response>"
_NAME_KEY = '{"name": "'
_ARGUMENTS_KEY = '", "arguments": '
_END = "}" + CALL_CLOSE
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(slots=True, frozen=True)
class ToolFunction:
    """One function the request offers."""

    name: str
    description: str
    parameters: dict[str, Any]
    """The JSON schema of its arguments (an object)."""


@dataclass(slots=True, frozen=True)
class ToolPlan:
    """What a request lets the model do with its tools."""

    offered: tuple[ToolFunction, ...]
    """Every tool of the request, listed in the prompt."""
    callable: tuple[ToolFunction, ...]
    """The functions the model may call now: all of them, or the one `tool_choice` names."""
    required: bool
    """True when the answer must be a call (`required` or a named function)."""
    parallel: bool = True
    """More than one call may make the answer (`parallel_tool_calls`, true unless the request says
    false, as at OpenAI); false: exactly one."""


def tool_plan(params: ChatCompletionRequest) -> ToolPlan | None:
    """The request's tools and tool choice, validated (a 400 names the field); None: no call possible."""
    choice = params.tool_choice
    if not params.tools:
        if choice is not None and choice != "none":
            raise InvalidRequest("tool_choice is only allowed when tools are specified", param="tool_choice")
        return None
    offered = tuple(_function(tool, i) for i, tool in enumerate(params.tools))
    if len({f.name for f in offered}) != len(offered):
        raise InvalidRequest("tool function names must be unique", param="tools")
    parallel = params.parallel_tool_calls is not False
    if choice is None or choice == "auto":
        return ToolPlan(offered=offered, callable=offered, required=False, parallel=parallel)
    if choice == "none":
        return None
    if choice == "required":
        return ToolPlan(offered=offered, callable=offered, required=True, parallel=parallel)
    function = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(function, dict):
        name = function.get("name")
        named = [f for f in offered if f.name == name]
        if not named:
            raise InvalidRequest(f"tool_choice names a function not in tools: {name!r}", param="tool_choice")
        return ToolPlan(offered=offered, callable=tuple(named), required=True, parallel=parallel)
    raise InvalidRequest(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
        param="tool_choice",
    )


def _function(tool: dict[str, Any], index: int) -> ToolFunction:
    where = f"tools[{index}]"
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise InvalidRequest(f"{where}: only tools of type 'function' are supported", param="tools")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequest(f"{where}.function.name must match ^[a-zA-Z0-9_-]{{1,64}}$", param="tools")
    parameters = function.get("parameters", _NO_PARAMETERS)
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise InvalidRequest(f"{where}.function.parameters must be a JSON schema of an object", param="tools")
    description = function.get("description") or ""
    return ToolFunction(name=name, description=str(description), parameters=parameters)


def call_text(name: str, arguments: str) -> str:
    """A call as the model reads and writes it; `arguments` is the call's JSON text."""
    return f"{CALL_OPEN}{_NAME_KEY}{name}{_ARGUMENTS_KEY}{arguments}{_END}"


def call_prefix(name: str) -> str:
    """The text of a call to `name` up to its arguments (what the grammar writes for it)."""
    return f"{CALL_OPEN}{_NAME_KEY}{name}{_ARGUMENTS_KEY}"


CALL_SUFFIX = _END
"""The text after a call's arguments."""


def tools_prompt(plan: ToolPlan) -> str:
    """The system-message section that tells a model whose template has no tools about them."""
    listing = "\n".join(
        json.dumps(
            {"name": f.name, "description": f.description, "parameters": f.parameters}, ensure_ascii=False
        )
        for f in plan.offered
    )
    if plan.required:
        rule = (
            "Answer with calls and nothing else: one call for each result you need, one after another."
            if plan.parallel
            else "Answer with a call to one of them and nothing else."
        )
    else:
        rule = (
            "Call them when you need their results (one call for each, one after another)"
            if plan.parallel
            else "Call one when you need its result"
        ) + "; once a tool message holds the result, answer the user in plain text with it."
    return (
        f"You can call these functions (one JSON description per line):\n{listing}\n"
        f"A call is written as {CALL_OPEN}{_NAME_KEY}<function name>{_ARGUMENTS_KEY}<arguments as a JSON "
        f"object>{_END}; its result comes back in a tool message as {RESULT_OPEN}<result>{RESULT_CLOSE}. "
        + rule
    )


def history_call_text(tool_calls: list[dict[str, Any]]) -> str:
    """An assistant message's `tool_calls` written out in the call form (400 when malformed)."""
    parts = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(
                "each tool_calls item needs function.name and function.arguments", param="messages"
            )
        arguments = function.get("arguments")
        parts.append(call_text(function["name"], arguments if isinstance(arguments, str) else "{}"))
    return "".join(parts)


def tool_result_text(content: str) -> str:
    """A tool message's content as the model reads it (the Hermes style's wrapper)."""
    return f"{RESULT_OPEN}{content}{RESULT_CLOSE}"
