"""Real apps on chat completions, through the real gateway, on the embedded engine: LangChain's
`ChatOpenAI` (invoke, stream, structured output) and the OpenAI Agents SDK's chat-completions model
(a plain answer, and a function tool round trip: call, the tool's result back, the final answer)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from adapters.local import LocalEngineConfig
from tests.e2e.local_gateway import local_gateway
from tests.gateway_server import GatewayServer

pytestmark = pytest.mark.slow

ENGINE = LocalEngineConfig(threads=1, kv_budget_tokens=8192, max_running=4)
MODEL = ENGINE.model_id
NO_TRACES = RunConfig(tracing_disabled=True)  # the SDK would send its traces to OpenAI's servers


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayServer]:
    with local_gateway(ENGINE) as server:
        yield server


@pytest.fixture
def chat_model(gateway: GatewayServer) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL, base_url=gateway.url, api_key="unused", temperature=0, max_tokens=40, max_retries=0
    )


def test_langchain_invoke_and_stream(chat_model: ChatOpenAI) -> None:
    answer = chat_model.invoke("What is the capital of France?")
    assert "Paris" in answer.text
    assert answer.response_metadata["finish_reason"] == "stop"
    pieces = list(chat_model.stream("What is the capital of France?"))
    assert len(pieces) > 2
    assert "".join(p.text for p in pieces) == answer.text


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)


def test_langchain_structured_output(chat_model: ChatOpenAI) -> None:
    city = chat_model.with_structured_output(City).invoke("Name the capital of France and its country.")
    assert isinstance(city, City) and city.name and city.country


@pytest.fixture
async def agents_model(gateway: GatewayServer) -> AsyncIterator[OpenAIChatCompletionsModel]:
    async with openai.AsyncOpenAI(
        base_url=gateway.url, api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield OpenAIChatCompletionsModel(model=MODEL, openai_client=client)


async def test_agents_sdk_chat_completions_model_answers(agents_model: OpenAIChatCompletionsModel) -> None:
    agent = Agent(
        name="geographer",
        instructions="Answer in one short sentence.",
        model=agents_model,
        model_settings=ModelSettings(temperature=0, max_tokens=40),
    )
    result = await Runner.run(agent, "What is the capital of France?", run_config=NO_TRACES)
    assert "Paris" in result.final_output


async def test_agents_sdk_structured_output_type(agents_model: OpenAIChatCompletionsModel) -> None:
    agent = Agent(
        name="geographer",
        instructions="Name the city the user asks for and its country.",
        model=agents_model,
        output_type=City,  # response_format json_schema, strict: the engine holds the answer to it
        model_settings=ModelSettings(temperature=0, max_tokens=60),
    )
    result = await Runner.run(agent, "What is the capital of France?", run_config=NO_TRACES)
    assert isinstance(result.final_output, City) and result.final_output.name


async def test_agents_sdk_function_tool_round_trip(agents_model: OpenAIChatCompletionsModel) -> None:
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"It is sunny and 24 C in {city}."

    agent = Agent(
        name="forecaster",
        instructions="Use the tool to find the weather, then tell the user.",
        model=agents_model,
        tools=[get_weather],
        # The first turn must call; the SDK then resets the choice to auto for the answer.
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60),
    )
    result = await Runner.run(agent, "What is the weather in Paris?", run_config=NO_TRACES, max_turns=4)
    assert asked == ["Paris"]
    assert isinstance(result.final_output, str) and result.final_output
    # Streamed: the SDK assembles the call from the engine's tool-call deltas.
    streamed = Runner.run_streamed(agent, "What is the weather in Paris?", run_config=NO_TRACES, max_turns=4)
    kinds = [event.type async for event in streamed.stream_events()]
    assert asked == ["Paris", "Paris"] and "raw_response_event" in kinds
    assert isinstance(streamed.final_output, str) and streamed.final_output
