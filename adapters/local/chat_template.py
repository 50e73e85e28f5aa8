"""Render the GGUF's chat template (Jinja2, sandboxed) the way `transformers` does.

The template comes from `tokenizer.chat_template`. Rendering matches Hugging Face's
`apply_chat_template`: an immutable sandbox with `trim_blocks` and `lstrip_blocks`, the
`loopcontrols` extension, a `raise_exception` helper and a `tojson` filter. A template that
raises, or a message the engine cannot put into text, becomes `InvalidRequest` (400).

Tools: a template that reads `tools` gets them and each message's `tool_calls` as `transformers`
passes them; any other (SmolLM2's) gets them written in by `adapters.local.tool_calls`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from adapters.errors import InvalidRequest
from adapters.local.tool_calls import ToolPlan, history_call_text, tool_result_text, tools_prompt
from adapters.schema import ChatMessage

# ChatML, used when a GGUF carries no template of its own.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    """A compiled chat template plus the special tokens it may refer to."""

    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        self._compiled = env.from_string(self.source)
        self.reads_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(self.source))
        """True when the template renders `tools` itself (else the engine writes them in)."""

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: ToolPlan | None = None,
    ) -> str:
        """The prompt text for `messages`, ending with the assistant's turn opener; `tools`: the
        functions the model may call, listed for it."""
        native = self.reads_tools
        items = [_as_template_dict(m, native_calls=native) for m in messages]
        extra: dict[str, Any] = {}
        if tools is not None and native:
            extra["tools"] = [
                {
                    "type": "function",
                    "function": {"name": f.name, "description": f.description, "parameters": f.parameters},
                }
                for f in tools.offered
            ]
        elif tools is not None:
            section = tools_prompt(tools)
            if items and items[0]["role"] == "system":
                items[0]["content"] = f"{items[0]['content']}\n\n{section}"
            else:
                items.insert(0, {"role": "system", "content": section})
        try:
            return self._compiled.render(
                messages=items,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"the chat template rejected the messages: {exc}", param="messages") from exc


def _as_template_dict(message: ChatMessage, *, native_calls: bool) -> dict[str, Any]:
    content = message.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest(
                    f"content part of type {part.get('type')!r} is not supported by the local engine; "
                    "only text parts are",
                    param="messages",
                )
            texts.append(part["text"])
        content = "".join(texts)
    out: dict[str, Any] = {"role": message.role, "content": content or ""}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls and native_calls:
        out["tool_calls"] = message.tool_calls
    elif message.tool_calls:
        out["content"] += history_call_text(message.tool_calls)
    elif message.role == "tool" and not native_calls:
        out["content"] = tool_result_text(out["content"])
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out
