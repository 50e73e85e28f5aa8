"""Several tool calls in one turn on the embedded engine, through the real gateway: chat completions
and Responses by the openai SDK, whole and streamed, and the OpenAI Agents SDK running both tools.

`parallel_tool_calls` is true unless a request says false (as at OpenAI): a `required` answer holds
one or more calls, each held by the grammar to its function's parameter schema; false keeps exactly
one. SmolLM2-135M makes two calls when an earlier turn of the conversation shows it two (`SHOWN`),
on the C kernels and on torch's (hosts without AVX-512) alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import jsonschema
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)

from adapters.local import LocalEngineConfig
from tests.e2e.local_gateway import local_gateway
from tests.gateway_server import GatewayServer

pytestmark = pytest.mark.slow

ENGINE = LocalEngineConfig(threads=1, kv_budget_tokens=8192, max_running=4)
MODEL = ENGINE.model_id
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
FUNCTIONS = {"get_weather": "The current weather in a city.", "get_time": "The current time in a city."}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": name, "description": text, "parameters": CITY}}
    for name, text in FUNCTIONS.items()
]
RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": name, "description": text, "parameters": CITY}
    for name, text in FUNCTIONS.items()
]
QUESTION = "What is the weather in Paris and the time in Tokyo?"
WANTED = [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Tokyo"})]
SHOWN: list[Any] = [
    {"role": "user", "content": "What is the weather in Rome and the time in Oslo?"},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
    {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": '{"city": "Oslo"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "Sunny, 20 C"},
    {"type": "function_call_output", "call_id": "c2", "output": "09:00"},
    {"role": "assistant", "content": "It is sunny and 20 C in Rome, and 09:00 in Oslo."},
]
"""An earlier turn with two calls, as Responses input items (the Agents SDK's input too)."""
CHAT_SHOWN: list[Any] = [
    SHOWN[0],
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": i["call_id"],
                "type": "function",
                "function": {"name": i["name"], "arguments": i["arguments"]},
            }
            for i in SHOWN[1:3]
        ],
    },
    *({"role": "tool", "tool_call_id": i["call_id"], "content": i["output"]} for i in SHOWN[3:5]),
    SHOWN[5],
]
NO_TRACES = RunConfig(tracing_disabled=True)


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayServer]:
    with local_gateway(ENGINE) as server:
        yield server


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


def chat(client: openai.OpenAI, **fields: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL,
        messages=[*CHAT_SHOWN, {"role": "user", "content": QUESTION}],
        tools=CHAT_TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=80,
        **fields,
    )


def test_chat_answers_with_two_calls_whole_and_streamed(client: openai.OpenAI) -> None:
    whole = chat(client).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    calls = whole.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == WANTED
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), CITY)
    assert len({c.id for c in calls}) == 2
    streamed: dict[int, dict[str, str]] = {}
    finish = []
    for chunk in chat(client, stream=True):
        for choice in chunk.choices:
            finish.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or ():
                call = streamed.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                if delta.id:  # the opening delta of each call: its id, type and name
                    assert delta.type == "function" and not call["id"]
                    call["id"], call["name"] = delta.id, delta.function.name
                call["arguments"] += delta.function.arguments or ""
    assert sorted(streamed) == [0, 1] and [r for r in finish if r] == ["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == [
        (c.function.name, c.function.arguments) for c in calls
    ]


def test_hosts_without_avx512_answer_with_both_calls_too() -> None:
    with (
        local_gateway(replace(ENGINE, c_kernels=False)) as server,  # torch's kernels
        openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120) as sdk,
    ):
        calls = chat(sdk).choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == WANTED


def test_parallel_tool_calls_false_keeps_exactly_one(client: openai.OpenAI) -> None:
    choice = chat(client, parallel_tool_calls=False).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == WANTED[
        :1
    ]


def test_responses_answer_with_two_function_call_items_whole_and_streamed(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "input": [*SHOWN, {"role": "user", "content": QUESTION}],
        "tools": RESPONSES_TOOLS,
        "tool_choice": "required",
        "temperature": 0,
        "max_output_tokens": 80,
    }
    whole = client.responses.create(**request)
    assert [(i.type, i.name, json.loads(i.arguments)) for i in whole.output] == [  # type: ignore[union-attr]
        ("function_call", *wanted) for wanted in WANTED
    ]
    with client.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    deltas: dict[int, str] = {}
    for event in events:
        if event.type == "response.function_call_arguments.delta":
            deltas[event.output_index] = deltas.get(event.output_index, "") + event.delta
    assert added == [0, 1] and sorted(deltas) == [0, 1]
    assert [deltas[0], deltas[1]] == [i.arguments for i in final.output]  # type: ignore[union-attr]
    assert [i.arguments for i in final.output] == [i.arguments for i in whole.output]  # type: ignore[union-attr]
    single = client.responses.create(**request, parallel_tool_calls=False)
    assert [i.name for i in single.output] == ["get_weather"] and not single.parallel_tool_calls  # type: ignore[union-attr]


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_an_agent_runs_both_tools_of_one_turn(gateway: GatewayServer, api: str) -> None:
    asked: list[tuple[str, str]] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(("get_weather", city))
        return f"Sunny, 24 C in {city}."

    @function_tool
    def get_time(city: str) -> str:
        """The current time in a city."""
        asked.append(("get_time", city))
        return f"It is 18:00 in {city}."

    async with openai.AsyncOpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120) as sdk:
        model = (
            OpenAIChatCompletionsModel(model=MODEL, openai_client=sdk)
            if api == "chat_completions"
            else OpenAIResponsesModel(model=MODEL, openai_client=sdk)
        )
        agent = Agent(
            name="concierge",
            instructions="Use the tools to answer.",
            model=model,
            tools=[get_weather, get_time],
            # The first turn must call; the SDK then resets the choice to auto for the answer.
            model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=80),
        )
        result = await Runner.run(
            agent, [*SHOWN, {"role": "user", "content": QUESTION}], run_config=NO_TRACES, max_turns=4
        )
    assert asked == [("get_weather", "Paris"), ("get_time", "Tokyo")]
    assert isinstance(result.final_output, str) and result.final_output
