"""The engine under a grammar: JSON of the schema every time, tool calls, masks per row of a shared batch."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from adapters.local import LocalEngine
from adapters.local.grammar import GrammarCompiler
from adapters.schema import ChatCompletionRequest, ChatMessage, StreamOptions
from tests.adapters.local.conftest import chat, collect_stream, streamed_text, wrap

pytestmark = pytest.mark.slow

SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "person": (
        "Describe Alice, who is 30 years old, as JSON.",
        {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
    ),
    "enum_and_bool": (
        "Is the sky blue? Answer as JSON.",
        {
            "type": "object",
            "properties": {
                "answer": {"type": "string", "enum": ["yes", "no"]},
                "confident": {"type": "boolean"},
            },
            "required": ["answer", "confident"],
            "additionalProperties": False,
        },
    ),
    "array_of_numbers": (
        "List three prime numbers as JSON.",
        {
            "type": "object",
            "properties": {
                "primes": {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3}
            },
            "required": ["primes"],
            "additionalProperties": False,
        },
    ),
    "nested_ref": (
        "Give a city and its country as JSON.",
        {
            "$defs": {
                "place": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 30}},
                    "required": ["name"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"city": {"$ref": "#/$defs/place"}, "country": {"$ref": "#/$defs/place"}},
            "required": ["city", "country"],
            "additionalProperties": False,
        },
    ),
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}


def json_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


async def answer(engine: LocalEngine, question: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(
        (await engine.complete(chat(question, **{"max_tokens": 80, **fields}))).body
    )
    return body


@pytest.mark.parametrize("name", sorted(SCHEMAS))
async def test_every_answer_is_json_of_its_schema_streamed_or_not(engine: LocalEngine, name: str) -> None:
    question, schema = SCHEMAS[name]
    fmt = json_format(schema)
    for fields in ({"temperature": 0}, {"temperature": 1.0, "seed": 3, "n": 2}):
        body = await answer(engine, question, response_format=fmt, **fields)
        for choice in body["choices"]:
            assert choice["finish_reason"] == "stop"
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    chunks = await collect_stream(
        engine, chat(question, max_tokens=80, temperature=0, response_format=fmt, stream=True)
    )
    greedy = await answer(engine, question, response_format=fmt, temperature=0)
    assert streamed_text(chunks) == greedy["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(streamed_text(chunks)), schema)


async def test_json_object_is_an_object(engine: LocalEngine) -> None:
    body = await answer(
        engine,
        'Reply with {"ok": true} and nothing else.',
        response_format={"type": "json_object"},
        temperature=0,
    )
    assert isinstance(json.loads(body["choices"][0]["message"]["content"]), dict)


async def test_constrained_and_free_rows_share_steps_without_touching_each_other(engine: LocalEngine) -> None:
    free = chat("Name three rivers in Europe.", temperature=0, max_tokens=30)
    question, schema = SCHEMAS["person"]
    constrained = chat(question, temperature=0, max_tokens=60, response_format=json_format(schema))
    alone = [json.loads((await engine.complete(r)).body) for r in (free, constrained)]
    together = await asyncio.gather(*(engine.complete(r) for r in (free, constrained, free, constrained)))
    texts = [json.loads(r.body)["choices"][0]["message"]["content"] for r in together]
    assert texts == [a["choices"][0]["message"]["content"] for a in alone] * 2
    assert not texts[0].startswith("{")


async def test_required_and_named_tool_choice_call_with_valid_arguments(engine: LocalEngine) -> None:
    parameters = WEATHER["function"]["parameters"]  # type: ignore[index]
    named = {"type": "function", "function": {"name": "get_time"}}
    for tools, choice, expect in (
        ([WEATHER], "required", "get_weather"),
        ([WEATHER, TIME], named, "get_time"),
    ):
        body = await answer(
            engine, "What is the weather in Paris?", tools=tools, tool_choice=choice, temperature=0
        )
        picked = body["choices"][0]
        assert picked["finish_reason"] == "tool_calls" and picked["message"]["content"] is None
        (call,) = picked["message"]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] == expect
        arguments = json.loads(call["function"]["arguments"])
        if expect == "get_weather":
            jsonschema.validate(arguments, parameters)
            assert arguments == {"city": "Paris"}


async def test_streamed_tool_call_deltas_have_openais_shape(engine: LocalEngine) -> None:
    request = chat(
        "What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=60,
        stream=True,
        stream_options=StreamOptions(include_usage=True),
    )
    chunks = await collect_stream(engine, request)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    first, rest = calls[0], calls[1:]
    assert first["index"] == 0 and first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    assert rest and all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in rest)
    assert json.loads("".join(c["function"]["arguments"] for c in rest)) == {"city": "Paris"}
    assert not any(d.get("content") for d in deltas)
    finals = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert finals == ["tool_calls"] and chunks[-1]["usage"]["completion_tokens"] > 0


async def test_auto_answers_in_text_when_no_call_is_made_and_reads_tool_results(engine: LocalEngine) -> None:
    body = await answer(engine, "Say hello.", tools=[WEATHER], temperature=0)
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and choice["message"]["content"]
    assert "tool_calls" not in choice["message"]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    history = ChatCompletionRequest(
        model="test",
        messages=[
            ChatMessage(role="user", content="What is the weather in Paris?"),
            ChatMessage(role="assistant", content=None, tool_calls=[call]),
            ChatMessage(role="tool", content="Sunny, 24 C", tool_call_id="call_1"),
        ],
        tools=[WEATHER],
        temperature=0,
        max_tokens=30,
    )
    reply = json.loads((await engine.complete(wrap(history, "chat"))).body)["choices"][0]
    assert reply["finish_reason"] in ("stop", "length") and reply["message"]["content"]


async def test_logprobs_stream_and_body_agree(engine: LocalEngine) -> None:
    fields: dict[str, Any] = {"temperature": 0, "max_tokens": 6, "logprobs": True, "top_logprobs": 3}
    body = await answer(engine, "Say yes.", **fields)
    chunks = await collect_stream(engine, chat("Say yes.", stream=True, **fields))
    streamed = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    whole = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in streamed] == [e["token"] for e in whole]
    # The second run reads the prompt's KV from the prefix cache: the same figures to float rounding.
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in whole], abs=1e-3)
    assert all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in whole)
    assert "".join(e["token"] for e in whole) == body["choices"][0]["message"]["content"]


async def test_logprobs_under_a_grammar_are_those_of_the_allowed_tokens(engine: LocalEngine) -> None:
    question, schema = SCHEMAS["enum_and_bool"]
    fields = {"temperature": 0, "logprobs": True, "top_logprobs": 5, "response_format": json_format(schema)}
    content = (await answer(engine, question, **fields))["choices"][0]["logprobs"]["content"]
    assert content[0]["token"] == '{"' and content[0]["logprob"] == 0.0  # the only token allowed
    assert all(
        len(e["top_logprobs"]) >= 1 and all(t["logprob"] > -1e30 for t in e["top_logprobs"]) for e in content
    )


async def test_hosts_without_avx512_enforce_the_schema_too(make_engine: Callable[..., LocalEngine]) -> None:
    stock = make_engine(c_kernels=False)  # torch's kernels: the path of every host without AVX-512
    question, schema = SCHEMAS["person"]
    body = await answer(stock, question, temperature=0, response_format=json_format(schema))
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)


async def test_the_grammar_vocabulary_is_built_off_the_event_loop_when_first_needed(
    make_engine: Callable[..., LocalEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain requests never build it (~20 MiB); the first constrained one builds it in a worker thread."""
    builders: list[threading.Thread] = []
    build = GrammarCompiler.build_vocabulary

    def recorded(self: GrammarCompiler) -> None:
        builders.append(threading.current_thread())
        build(self)

    monkeypatch.setattr(GrammarCompiler, "build_vocabulary", recorded)
    fresh = make_engine()
    await answer(fresh, "Say hi.", max_tokens=4)
    await answer(fresh, "Say hi.", max_tokens=4, response_format={"type": "text"})
    assert builders == []
    question = 'Reply with {"ok": true} and nothing else.'
    body = await answer(fresh, question, response_format={"type": "json_object"}, temperature=0)
    assert isinstance(json.loads(body["choices"][0]["message"]["content"]), dict)
    assert len(builders) == 1 and builders[0] is not threading.main_thread()
    await answer(fresh, question, response_format={"type": "json_object"}, temperature=0)
    assert len(builders) == 1
