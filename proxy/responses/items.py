"""A response's input items (`GET /v1/responses/{id}/input_items`): what they are, and one page of them.

A response's input items are the whole context it answered, as OpenAI lists them: a continuation's
are its previous response's input items, then that response's output items, then its own input. Each
item gets an id when it came without one (`msg_`, `fc_`, `fco_`, `item_`), and is kept in the
Responses form the SDK reads (`ResponseItem`):

    input string                    a `user` message with one `input_text` part
    message items                   `content` as parts (a string becomes one `input_text` part, or
                                    `output_text` for `assistant`), `status` `completed`
    function_call, ..._output       as sent, with `status` `completed`
    anything else                   as sent (only a worker that serves `/v1/responses` accepts it)

`include` names fields to add; of the values OpenAI defines, two concern what is stored here:
`message.input_image.image_url` (an input image's URL, else left out as `null`) and
`message.output_text.logprobs` (an output text's `logprobs`, where the item has them, else dropped).
The others name fields of item kinds only a Responses worker produces; those items are kept whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from proxy.errors import ApiError

Item = dict[str, Any]

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
"""OpenAI's page size: 20 items unless `limit` (1 to 100) says otherwise."""
INCLUDABLE = frozenset(
    {
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
    }
)
"""The `include` values OpenAI defines (the SDK's `ResponseIncludable`); any other is a 400."""
IMAGE_URLS = "message.input_image.image_url"
LOGPROBS = "message.output_text.logprobs"
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


class _Stored(msgspec.Struct):
    output: list[Item] = msgspec.field(default_factory=list)


_stored = msgspec.json.Decoder(_Stored)
_items = msgspec.json.Decoder(list[Item])
encode = msgspec.json.Encoder().encode


def context_items(input_items: bytes, response: bytes) -> list[Item]:
    """What a continuation of a stored response starts from: its input items, then its output."""
    return [*_items.decode(input_items), *_stored.decode(response).output]


def request_items(items: str | list[Item], new_id: Callable[[str], str]) -> list[Item]:
    """A request's `input` as input items; `new_id(prefix)` makes the ids of items sent without one."""
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    return [_item(item, new_id) for item in items]


def _item(item: Item, new_id: Callable[[str], str]) -> Item:
    kind = item.get("type", "message")
    out = {**item, "type": kind}
    if not isinstance(out.get("id"), str):
        out["id"] = new_id(_ID_PREFIXES.get(kind, "item") if isinstance(kind, str) else "item")
    if kind == "message":
        content = out.get("content")
        if isinstance(content, str):
            part = "output_text" if out.get("role") == "assistant" else "input_text"
            text: Item = {"type": part, "text": content}
            if part == "output_text":
                text["annotations"] = []
            out["content"] = [text]
    if kind in _ID_PREFIXES:
        out.setdefault("status", "completed")
    return out


@dataclass(slots=True, frozen=True)
class PageQuery:
    """`GET /v1/responses/{id}/input_items`'s query."""

    order: str = "desc"
    after: str | None = None
    limit: int = DEFAULT_LIMIT
    include: frozenset[str] = frozenset()


def page_query(params: Iterable[tuple[str, str]]) -> PageQuery:
    """The query's `order`, `after`, `limit` and `include` (`include=a&include=b` or `include[]=`);
    a bad value is a 400 naming it."""
    order, after, limit, include = "desc", None, DEFAULT_LIMIT, set[str]()
    for name, value in params:
        if name == "order":
            if value not in ("asc", "desc"):
                raise _invalid("order", "must be `asc` or `desc`")
            order = value
        elif name == "after":
            after = value
        elif name == "limit":
            if not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
                raise _invalid("limit", f"must be an integer from 1 to {MAX_LIMIT}")
            limit = int(value)
        elif name in ("include", "include[]"):
            if value not in INCLUDABLE:
                raise _invalid("include", f"has an unknown value `{value}`")
            include.add(value)
    return PageQuery(order, after, limit, frozenset(include))


def page(items: Sequence[Item], query: PageQuery) -> Item:
    """One page of `items` (oldest first), as OpenAI's list object."""
    ordered = list(items) if query.order == "asc" else list(reversed(items))
    start = 0
    if query.after is not None:
        ids = [item.get("id") for item in ordered]
        if query.after not in ids:
            raise _invalid("after", f"names no input item of this response: `{query.after}`")
        start = ids.index(query.after) + 1
    data = [_shown(item, query.include) for item in ordered[start : start + query.limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + query.limit < len(ordered),
    }


def stored_items(encoded: bytes) -> list[Item]:
    return _items.decode(encoded)


def _shown(item: Item, include: frozenset[str]) -> Item:
    """`item` with the fields `include` did not ask for left out."""
    content = item.get("content")
    if item.get("type") != "message" or not isinstance(content, list):
        return item
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "input_image" and IMAGE_URLS not in include:
            part = {**part, "image_url": None}
        elif isinstance(part, dict) and part.get("type") == "output_text" and LOGPROBS not in include:
            part = {key: value for key, value in part.items() if key != "logprobs"}
        parts.append(part)
    return {**item, "content": parts}


def _invalid(param: str, reason: str) -> ApiError:
    return ApiError(400, f"Invalid request: `{param}` {reason}.", param=param, code="invalid_value")
