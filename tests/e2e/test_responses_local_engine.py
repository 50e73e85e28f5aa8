"""`/v1/responses` and `/v1/embeddings` on the embedded engine, by the openai SDK's Responses helpers
and the OpenAI Agents SDK's Responses model, unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

from adapters.local import LocalEngineConfig
from tests.e2e.local_gateway import local_gateway
from tests.gateway_server import GatewayServer

pytestmark = pytest.mark.slow

ENGINE = LocalEngineConfig(threads=1, kv_budget_tokens=8192, max_running=4)
MODEL = ENGINE.model_id
INSTRUCTIONS = "You are a geography tutor. Answer in one short sentence. " * 6


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayServer]:
    with local_gateway(ENGINE) as server:
        yield server


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


def test_create_answers_and_a_follow_up_reuses_the_history_kv(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL,
        instructions=INSTRUCTIONS,
        input="What is the capital of France?",
        temperature=0,
        max_output_tokens=24,
    )
    assert "Paris" in first.output_text
    assert first.usage is not None
    follow_up = client.responses.create(
        model=MODEL,
        instructions=INSTRUCTIONS,
        previous_response_id=first.id,
        input="And of Italy?",
        temperature=0,
        max_output_tokens=24,
    )
    assert follow_up.usage is not None
    history = first.usage.input_tokens + first.usage.output_tokens
    # The prompt and the answer of the first turn are in the engine's prefix cache (whole pages).
    assert follow_up.usage.input_tokens_details.cached_tokens >= history - 2 * ENGINE.page_size
    assert follow_up.usage.input_tokens > history
    # Its input items are the whole context it answered: the first turn, its answer, this turn.
    items = client.responses.input_items.list(follow_up.id, order="asc")
    assert [item.type for item in items.data] == ["message"] * 3 and not items.has_more
    assert [item.role for item in items.data] == ["user", "assistant", "user"]  # type: ignore[union-attr]
    assert items.data[1].id == first.output[0].id
    assert items.data[2].content[0].text == "And of Italy?"  # type: ignore[union-attr]


def test_stream_helper_and_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL, input="Name one river in Europe.", temperature=0, max_output_tokens=32
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas and "".join(deltas) == final.output_text
    assert final.usage is not None and final.usage.output_tokens >= len(deltas)
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_an_agents_sdk_agent_answers_and_continues(gateway: GatewayServer, client: openai.OpenAI) -> None:
    set_tracing_disabled(True)

    async def run() -> tuple[str, str | None, str, str | None]:
        async with openai.AsyncOpenAI(base_url=gateway.url, api_key="unused", max_retries=0) as sdk:
            agent = Agent(
                name="tutor",
                instructions="Answer in one short sentence.",
                model=OpenAIResponsesModel(MODEL, sdk),
                model_settings=ModelSettings(temperature=0, max_tokens=32),
            )
            first = await Runner.run(agent, "What is the capital of France?")
            streamed = Runner.run_streamed(
                agent, "And of Spain?", previous_response_id=first.last_response_id
            )
            async for _ in streamed.stream_events():
                pass
            return (
                str(first.final_output),
                first.last_response_id,
                str(streamed.final_output),
                (streamed.last_response_id),
            )

    first_text, first_id, second_text, second_id = asyncio.run(run())
    assert "Paris" in first_text and second_text
    assert first_id is not None and second_id is not None
    first, second = client.responses.retrieve(first_id), client.responses.retrieve(second_id)
    assert second.previous_response_id == first_id
    assert first.usage is not None and second.usage is not None
    # The second turn carried the first one's history, and found it in the engine's prefix cache.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - ENGINE.page_size


def test_embeddings_are_a_clear_error_here(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MODEL, input="no embedding model ships with the engine")
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"]) == ("model", "model_not_supported")
    assert "embedding" in error["message"]
