"""`/v1/responses` through the gateway in front of test upstreams that speak chat completions only,
driven by the openai SDK: translation, stream events, stored conversations, tenants and routing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.routing.config import RoutingSettings
from proxy.settings import ApiKeySettings, AuthSettings
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import CACHED_TOKENS, REPLY_WORDS, Fault, UpstreamServer

KEYS = {"alice": "sk-alice", "bob": "sk-bob"}
AUTH = AuthSettings(api_keys=[ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()])
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def served(upstream_server: UpstreamServer) -> Iterator[GatewayServer]:
    server = GatewayServer(create_app(gateway_settings(upstream_server.url, auth=AUTH))).start()
    yield server
    server.stop()


def sdk(gateway: GatewayServer, tenant: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=KEYS[tenant], max_retries=0, timeout=10)


def test_create_translates_to_chat_and_back(served: GatewayServer, upstream: UpstreamServer) -> None:
    response = sdk(served).responses.create(
        model=MODEL,
        instructions="Answer briefly.",
        input="Say hello.",
        max_output_tokens=3,
        temperature=0.5,
        top_p=0.9,
        text={"format": {"type": "json_schema", "name": "greeting", "schema": {"type": "object"}}},
    )
    sent = upstream.generation_requests()[-1]
    assert sent.path == "/v1/chat/completions"
    body = sent.json
    assert body["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Say hello."},
    ]
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (3, 0.5, 0.9)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "greeting", "schema": {"type": "object"}},
    }
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == "".join(REPLY_WORDS[:3])
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.output_tokens == 3
    assert response.usage.input_tokens_details.cached_tokens == CACHED_TOKENS


def test_function_tools_round_trip(served: GatewayServer, upstream: UpstreamServer) -> None:
    client = sdk(served)
    first = client.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",  # type: ignore[list-item]
    )
    body = upstream.generation_requests()[-1].json
    assert body["tools"] == [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ]
    assert body["tool_choice"] == "required"
    (call,) = first.output
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}],
        tool_choice={"type": "function", "name": "get_weather"},
        tools=[WEATHER],  # type: ignore[list-item]
    )
    body = upstream.generation_requests()[-1].json
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"},
    ]
    assert second.previous_response_id == first.id


def test_input_items_become_chat_messages(served: GatewayServer, upstream: UpstreamServer) -> None:
    sdk(served).responses.create(
        model=MODEL,
        input=[
            {"role": "developer", "content": "Be terse."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
        ],
    )
    assert upstream.generation_requests()[-1].json["messages"] == [
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "Hello.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]


def test_stream_events_in_order_and_the_final_response(
    served: GatewayServer, upstream: UpstreamServer
) -> None:
    with sdk(served).responses.stream(model=MODEL, input="Stream, please.") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(REPLY_WORDS),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "".join(REPLY_WORDS) and final.status == "completed"
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == CACHED_TOKENS
    assert upstream.generation_requests()[-1].json["stream_options"] == {"include_usage": True}
    assert sdk(served).responses.retrieve(final.id).output_text == final.output_text


def test_a_failure_midway_ends_with_an_error_event(served: GatewayServer, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(inband_error_after_chunks=3))
    events = list(sdk(served).responses.create(model=MODEL, input="Fail midway.", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1].response.status == "failed"  # type: ignore[union-attr]
    assert events[-1].response.error is not None  # type: ignore[union-attr]


def test_follow_ups_rebuild_the_conversation(served: GatewayServer, upstream: UpstreamServer) -> None:
    client = sdk(served)
    first = client.responses.create(model=MODEL, instructions="Be kind.", input="One.")
    second = client.responses.create(
        model=MODEL, instructions="Be brief.", previous_response_id=first.id, input="Two."
    )
    client.responses.create(model=MODEL, previous_response_id=second.id, input="Three.")
    reply = "".join(REPLY_WORDS)
    # Instructions are this request's only (as at OpenAI); the history is every earlier turn.
    assert upstream.generation_requests()[-1].json["messages"] == [
        {"role": "user", "content": "One."},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Two."},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Three."},
    ]


def test_stored_responses_belong_to_their_tenant(served: GatewayServer) -> None:
    alice, bob = sdk(served, "alice"), sdk(served, "bob")
    kept = alice.responses.create(model=MODEL, input="Alice's secret.")
    for attempt in (
        lambda: bob.responses.retrieve(kept.id),
        lambda: bob.responses.delete(kept.id),
        lambda: bob.responses.input_items.list(kept.id),
        lambda: bob.responses.create(model=MODEL, previous_response_id=kept.id, input="What did she say?"),
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert refused.value.body["code"] == "response_not_found"  # type: ignore[index]
    assert alice.responses.retrieve(kept.id).output_text == kept.output_text
    assert alice.responses.input_items.list(kept.id).data[0].content[0].text == "Alice's secret."  # type: ignore[union-attr]
    alice.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(kept.id)


def test_store_false_keeps_nothing(served: GatewayServer) -> None:
    client = sdk(served)
    answer = client.responses.create(model=MODEL, input="Forget this.", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(answer.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, previous_response_id=answer.id, input="And?")


def test_input_items_list_the_whole_context_a_page_at_a_time(served: GatewayServer) -> None:
    client = sdk(served)
    image = {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "auto"}
    first = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "One."}, image]}],
    )
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            {"role": "user", "content": "Two."},
        ],
    )
    # A continuation's input items: the first turn's input, its output, then this turn's input.
    listed = list(client.responses.input_items.list(second.id, order="asc", limit=2))  # pages followed
    assert [item.type for item in listed] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert listed[1].id == first.output[0].id and listed[1].role == "assistant"
    assert [listed[2].call_id, listed[3].output] == ["c1", "done"]  # type: ignore[union-attr]
    assert listed[4].content[0].text == "Two."  # type: ignore[union-attr]
    assert len({item.id for item in listed}) == 5 and all(item.id for item in listed)
    newest = client.responses.input_items.list(second.id, limit=2)
    assert [item.id for item in newest.data] == [listed[4].id, listed[3].id] and newest.has_more
    after = client.responses.input_items.list(second.id, after=listed[3].id)
    assert [item.id for item in after.data] == [i.id for i in reversed(listed[:3])] and not after.has_more
    # An input image's URL is listed only when `include` asks for it.
    assert listed[0].content[1].image_url is None  # type: ignore[union-attr]
    shown = client.responses.input_items.list(first.id, include=["message.input_image.image_url"])
    assert shown.data[0].content[1].image_url == image["image_url"]  # type: ignore[union-attr]
    assert [item.id for item in shown.data] == [listed[0].id]


@pytest.mark.parametrize(
    ("query", "param"),
    [("limit=0", "limit"), ("limit=101", "limit"), ("order=up", "order"), ("include[]=x", "include")],
)
def test_bad_input_item_queries_are_400s(served: GatewayServer, query: str, param: str) -> None:
    kept = sdk(served).responses.create(model=MODEL, input="Hi.")
    answer = httpx.get(
        f"{served.url}/responses/{kept.id}/input_items?{query}",
        headers={"authorization": f"Bearer {KEYS['alice']}"},
        timeout=10,
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": []}, "input"),
    ],
)
def test_what_cannot_be_translated_is_a_400_naming_it(
    served: GatewayServer, body: dict[str, Any], param: str
) -> None:
    answer = httpx.post(
        served.url + "/responses",
        json={"model": MODEL, **body},
        headers={"authorization": f"Bearer {KEYS['alice']}"},
        timeout=10,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_follow_ups_stay_on_their_previous_worker() -> None:
    """Round robin alone would alternate; the hint keeps each conversation where its history is."""
    upstreams = [UpstreamServer(models=(MODEL,)).start() for _ in range(2)]
    settings = gateway_settings(
        *(u.url for u in upstreams), routing=RoutingSettings(policy="round_robin", health_interval_s=30)
    )
    gateway = GatewayServer(create_app(settings)).start()
    try:
        client = openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=10)
        for conversation in range(2):
            previous = client.responses.create(model=MODEL, input=f"Conversation {conversation}.")
            for turn in range(3):
                previous = client.responses.create(
                    model=MODEL, previous_response_id=previous.id, input=f"{turn}"
                )
        served_by = [[r.json["messages"][0]["content"] for r in u.generation_requests()] for u in upstreams]
        assert sorted(served_by) == [["Conversation 0."] * 4, ["Conversation 1."] * 4]
    finally:
        gateway.stop()
        for upstream in upstreams:
            upstream.stop()


def test_an_agents_sdk_agent_calls_its_tool_through_responses(served: GatewayServer) -> None:
    """The OpenAI Agents SDK's Responses model: the test upstream always calls the first tool, the
    agent runs it and stops there; then a follow-up run continues the stored conversation."""
    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}"

    async def run() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=served.url, api_key=KEYS["alice"], max_retries=0) as client:
            model = OpenAIResponsesModel(MODEL, client)
            agent = Agent(
                name="weather", model=model, tools=[get_weather], tool_use_behavior="stop_on_first_tool"
            )
            first = await Runner.run(agent, "Weather in Paris?")
            plain = Agent(name="chat", model=model, instructions="Be brief.")
            second = await Runner.run(plain, "And tomorrow?", previous_response_id=first.last_response_id)
            return str(first.final_output), str(second.final_output)

    assert asyncio.run(run()) == ("Sunny in Paris", "".join(REPLY_WORDS))
