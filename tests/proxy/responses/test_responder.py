"""`ResponsesResponder` on chat chunks it is handed directly: tool-call deltas become a
`function_call` item with its argument events, and a stored turn remembers the call."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from adapters.base import RouteHint
from proxy.responses.responder import ResponsesResponder
from proxy.responses.schema import ResponsesRequest
from proxy.responses.store import ResponseStore
from proxy.responses.turn import Turn


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    return json.dumps(
        {"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
    ).encode()


def tool_delta(arguments: str, *, name: str | None = None, call_id: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"index": 0, "function": {"arguments": arguments}}
    if name is not None:
        call.update(id=call_id, type="function")
        call["function"]["name"] = name
    return {"tool_calls": [call]}


async def test_streamed_tool_calls_become_function_call_events() -> None:
    frames: list[bytes] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body":
            frames.append(message["body"])

    store = ResponseStore(None, ttl_s=60)
    request = msgspec.convert({"model": "m", "input": "weather?", "stream": True}, ResponsesRequest)
    turn = Turn(request, "t", [], [{"role": "user", "content": "weather?"}], RouteHint(served_by="w1"))
    responder = ResponsesResponder(send, lambda: None, turn, store)
    await responder.start_stream([], chunk({"role": "assistant", "content": ""}))
    await responder.send_chunk(chunk(tool_delta('{"city": ', name="get_weather", call_id="call_7")))
    await responder.send_chunk(chunk(tool_delta('"Paris"}')))
    await responder.send_chunk(chunk({}, "tool_calls"))
    usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    await responder.send_chunk(json.dumps({"model": "m", "choices": [], "usage": usage}).encode())
    await responder.end_stream()

    events = [json.loads(frame.split(b"\ndata: ", 1)[1]) for frame in frames]
    assert [frame.split(b"\n", 1)[0] for frame in frames] == [f"event: {e['type']}".encode() for e in events]
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    item = events[-1]["response"]["output"][0]
    assert (item["type"], item["call_id"], item["name"]) == ("function_call", "call_7", "get_weather")
    assert json.loads(item["arguments"]) == {"city": "Paris"}
    assert events[-1]["response"]["usage"]["input_tokens"] == 5
    stored = store.get("t", turn.id)
    assert stored is not None and stored.worker == "w1"
    assert json.loads(stored.conversation)[-1]["tool_calls"][0]["function"]["name"] == "get_weather"
