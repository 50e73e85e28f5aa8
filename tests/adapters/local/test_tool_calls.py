"""Tool plans from requests, and the parser that turns a choice's text into content or calls."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.errors import InvalidRequest
from adapters.local.call_parser import CallDelta, CallParser, CallPiece
from adapters.local.tool_calls import ToolPlan, call_prefix, call_text, tool_plan
from adapters.schema import ChatCompletionRequest, ChatMessage

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[ChatMessage(role="user", content="hi")], **fields)


def test_auto_is_the_default_and_offers_every_tool() -> None:
    plan = tool_plan(chat(tools=[WEATHER, TIME]))
    assert plan is not None and not plan.required
    assert [f.name for f in plan.callable] == ["get_weather", "get_time"]
    assert plan.offered[1].parameters["type"] == "object"  # no parameters: an empty object


def test_a_named_function_is_the_only_callable_one() -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    plan = tool_plan(chat(tools=[WEATHER, TIME], tool_choice=choice))
    assert plan is not None and plan.required and [f.name for f in plan.callable] == ["get_time"]
    assert len(plan.offered) == 2


def test_none_and_no_tools_mean_no_plan() -> None:
    assert tool_plan(chat(tools=[WEATHER], tool_choice="none")) is None
    assert tool_plan(chat()) is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": "get_weather"}}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
    ],
)
def test_bad_tools_are_400(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        tool_plan(chat(**fields))
    assert raised.value.status == 400 and raised.value.param == param


def _plan(required: bool) -> ToolPlan:
    plan = tool_plan(chat(tools=[WEATHER], tool_choice="required" if required else "auto"))
    assert plan is not None
    return plan


def _feed(parser: CallParser, pieces: list[str]) -> list[CallDelta]:
    return [*(parser.push(p) for p in pieces), parser.finish()]


def _pieces(deltas: list[CallDelta]) -> list[CallPiece]:
    return [piece for delta in deltas for piece in delta.calls]


def _arguments(deltas: list[CallDelta], index: int) -> str:
    return "".join(p.arguments for p in _pieces(deltas) if p.index == index)


@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=16))
def test_streamed_arguments_join_to_each_call_however_the_text_is_cut(cuts: list[int]) -> None:
    first = json.dumps({"city": "Paris}</tool_call><tool_call>", "days": [1, {"a": '\\"}'}]})
    second = json.dumps({"timezone": "Europe/Paris"})
    text = call_text("get_weather", first) + call_text("get_time", second)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    parser = CallParser(_plan(required=False))
    deltas = _feed(parser, [text[a:b] for a, b in itertools.pairwise(bounds)])
    assert [(p.index, parser.calls[p.index].name) for p in _pieces(deltas) if p.opened] == [
        (0, "get_weather"),
        (1, "get_time"),
    ]
    assert (
        [c.arguments for c in parser.calls]
        == [_arguments(deltas, 0), _arguments(deltas, 1)]
        == [first, second]
    )
    assert len({c.id for c in parser.calls}) == 2
    assert all(not d.content for d in deltas)


def test_auto_text_that_does_not_open_a_call_is_content() -> None:
    parser = CallParser(_plan(required=False))
    deltas = _feed(parser, ["Hello", " <b>there</b>"])
    assert "".join(d.content for d in deltas) == "Hello <b>there</b>" and not parser.called


def test_a_call_cut_short_keeps_what_arrived() -> None:
    parser = CallParser(_plan(required=True))
    deltas = _feed(parser, [call_prefix("get_weather") + '{"city": "Par'])
    assert parser.called and _arguments(deltas, 0) == '{"city": "Par'
    before_name = CallParser(_plan(required=True))
    assert _feed(before_name, ['<tool_call>{"na'])[-1].content == '<tool_call>{"na'
    # A second call cut short before its name leaves the first whole, and no text.
    after_one = CallParser(_plan(required=True))
    deltas = _feed(after_one, [call_text("get_weather", '{"city": "Rome"}') + "<tool_ca"])
    assert [c.arguments for c in after_one.calls] == ['{"city": "Rome"}'] and not any(
        d.content for d in deltas
    )


def test_parallel_tool_calls_is_true_unless_the_request_says_false() -> None:
    assert _plan(required=True).parallel
    plan = tool_plan(chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False))
    assert plan is not None and not plan.parallel
