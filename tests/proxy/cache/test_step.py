"""The response-cache step over a memory store, its answers framed by the HTTP responder."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from adapters.base import Completion, EngineRequest
from adapters.errors import EngineError, UpstreamUnreachable
from adapters.schema import ChatCompletionRequest
from cachelayer.admission import AdmissionGate
from cachelayer.responses import ResponseCache
from cachelayer.tiers import StoreConfig, TieredStore
from proxy.asgi_types import Message
from proxy.cache.answers import complete_answer
from proxy.cache.step import CACHE_HEADER, ResponseCacheStep
from proxy.errors import ErrorDetail
from proxy.responder import Responder
from proxy.routes.asgi_responder import AsgiResponder

CHUNKS = [
    {
        "id": "c1",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
    },
    {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]},
    {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
]


def request(stream: bool, **fields: Any) -> EngineRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0, "stream": stream}
    body.update(fields)
    raw = json.dumps(body).encode()
    params = msgspec.json.decode(raw, type=ChatCompletionRequest)
    return EngineRequest("chat", params, raw, "req", "tenant", "salt")


class Upstream:
    """A `forward` that sends a scripted answer through the step's `Responder` and counts its calls.

    A stream's `ending`: "done" (ends cleanly), "error" (an error after its start), "cut" (never ended:
    the client left); `error` raises before any answer, as a failing engine does."""

    def __init__(
        self,
        payloads: list[bytes],
        *,
        stream: bool = True,
        ending: str = "done",
        error: EngineError | None = None,
    ) -> None:
        self.payloads, self.stream, self.ending, self.error, self.calls = payloads, stream, ending, error, 0

    async def __call__(self, responder: Responder) -> Completion | None:
        self.calls += 1
        if self.error is not None:
            raise self.error
        if not self.stream:
            body = b"".join(self.payloads)
            await responder.send_json(body, [])
            # As the pipeline does: the whole JSON answer, its choices left for the step to count.
            return Completion(body=body)
        await responder.start_stream([], self.payloads[0])
        for payload in self.payloads[1:]:
            await responder.send_chunk(payload)
        if self.ending == "done":
            await responder.end_stream()
        elif self.ending == "error":
            await responder.end_stream(ErrorDetail(message="boom", type="server_error"))
        return None


def chunks(*payloads: Any) -> list[bytes]:
    return [json.dumps(p).encode() for p in payloads]


def sse(*payloads: Any) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in chunks(*payloads)) + b"data: [DONE]\n\n"


async def serve(
    step: ResponseCacheStep, req: EngineRequest, upstream: Upstream, cache_control: str | None = None
) -> tuple[str, bytes]:
    """(x-radixgate-cache, whole body) of one request through the step, framed as the HTTP routes do."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    response_headers: list[tuple[bytes, bytes]] = []
    control = cache_control.encode() if cache_control is not None else None
    await step.respond(req, None, control, response_headers, AsgiResponder(send, lambda: None), upstream)
    await step.drain()
    outcome = dict(response_headers)[CACHE_HEADER].decode()
    return outcome, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.fixture
def step() -> ResponseCacheStep:
    return ResponseCacheStep(ResponseCache(TieredStore.from_config(StoreConfig())))


async def test_a_complete_stream_is_stored_and_replayed_byte_for_byte(step: ResponseCacheStep) -> None:
    upstream = Upstream(chunks(*CHUNKS))
    first = await serve(step, request(True), upstream)
    second = await serve(step, request(True), upstream)
    assert (first[0], second[0]) == ("miss", "hit")
    assert second[1] == first[1] == sse(*CHUNKS)
    assert upstream.calls == 1
    assert (step.monitor.total.stores, step.monitor.total.hits) == (1, 1)


@pytest.mark.parametrize(
    ("payloads", "ending"),
    [
        (chunks(*CHUNKS[:2]), "done"),  # ended cleanly, but the choice never finished
        (chunks(*CHUNKS), "cut"),  # never ended
        (chunks(*CHUNKS[:2]), "error"),  # an error event after its start
    ],
    ids=["unfinished", "cut", "error-event"],
)
async def test_incomplete_streams_are_not_stored(
    step: ResponseCacheStep, payloads: list[bytes], ending: str
) -> None:
    upstream = Upstream(payloads, ending=ending)
    outcomes = [(await serve(step, request(True), upstream))[0] for _ in range(2)]
    assert outcomes == ["miss", "miss"] and upstream.calls == 2
    assert (step.monitor.total.stores, step.monitor.total.not_stored) == (0, 2)


async def test_engine_errors_are_not_stored(step: ResponseCacheStep) -> None:
    upstream = Upstream([], stream=False, error=UpstreamUnreachable("down"))
    for _ in range(2):
        with pytest.raises(UpstreamUnreachable):
            await serve(step, request(False), upstream)
    assert upstream.calls == 2 and step.monitor.total.stores == 0


async def test_cache_control_directives(step: ResponseCacheStep) -> None:
    body = json.dumps({"id": "x", "choices": [{"index": 0, "finish_reason": "stop"}]}).encode()
    upstream = Upstream([body], stream=False)
    outcomes = [
        (await serve(step, request(False), upstream, cache_control="no-store"))[0],
        (await serve(step, request(False), upstream))[0],
        (await serve(step, request(False), upstream, cache_control="max-age=0, No-Cache"))[0],
        (await serve(step, request(False), upstream))[0],
    ]
    assert outcomes == ["bypass", "miss", "miss", "hit"]
    assert upstream.calls == 3
    assert (step.monitor.total.refreshes, step.monitor.total.bypasses) == (1, 1)


async def test_sampled_requests_bypass_and_a_disabled_cache_bypasses_all() -> None:
    upstream = Upstream(chunks(*CHUNKS))
    enabled = ResponseCacheStep(ResponseCache(TieredStore.from_config(StoreConfig())))
    assert (await serve(enabled, request(True, temperature=0.3), upstream))[0] == "bypass"
    assert (await serve(enabled, request(True, temperature=0.3, seed=4), upstream))[0] == "miss"
    assert (await serve(ResponseCacheStep(None), request(True), upstream))[0] == "bypass"


def test_complete_answer_needs_every_choice_finished() -> None:
    two = {"id": "a", "choices": [{"index": 0, "finish_reason": "stop"}, {"index": 1, "finish_reason": None}]}
    assert complete_answer([json.dumps(two).encode()]) is None
    two["choices"][1]["finish_reason"] = "length"  # type: ignore[index]
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert complete_answer([json.dumps({**two, "usage": usage}).encode()]) == (3, 4)
    assert complete_answer([b'{"choices": []}']) is None
    assert complete_answer([b"not json"]) is None


def test_complete_answer_rejects_an_in_band_error_in_a_body_or_a_stream() -> None:
    finished = b'{"choices": [{"index": 0, "finish_reason": "stop"}]}'
    error = b'{"error": {"message": "overloaded", "type": "server_error"}}'
    assert complete_answer([error]) is None
    assert complete_answer([finished, error]) is None
    assert complete_answer([b'{"error": "boom", "choices": [{"finish_reason": "stop"}]}']) is None
    # An explicit null error is no error.
    assert complete_answer([b'{"error": null, "choices": [{"finish_reason": "stop"}]}']) == (0, 0)
    assert complete_answer([b'{"choices": [{"index": 0}]}', finished]) == (0, 0)


def json_upstream() -> Upstream:
    body = json.dumps({"id": "x", "choices": [{"index": 0, "finish_reason": "stop"}]}).encode()
    return Upstream([body], stream=False)


async def test_second_sighting_admission_stores_a_repeated_request_on_its_second_miss() -> None:
    store = ResponseCache(TieredStore.from_config(StoreConfig()))
    step = ResponseCacheStep(store, admission=AdmissionGate("second_sighting"))
    upstream = json_upstream()
    outcomes = [(await serve(step, request(False), upstream))[0] for _ in range(3)]
    assert outcomes == ["miss", "miss", "hit"] and upstream.calls == 2
    assert (step.monitor.total.not_admitted, step.monitor.total.stores) == (1, 1)


async def test_adaptive_admission_stops_storing_when_nothing_repeats() -> None:
    store = ResponseCache(TieredStore.from_config(StoreConfig()))
    step = ResponseCacheStep(store, admission=AdmissionGate("adaptive", window_lookups=8))
    upstream = json_upstream()
    for number in range(8):  # one window of unique requests, all stored, none hit: the gate turns selective
        assert (await serve(step, request(False, max_tokens=number + 1), upstream))[0] == "miss"
    assert step.admission_for("tenant").selective and step.monitor.total.stores == 8
    outcomes = [(await serve(step, request(False, max_tokens=100), upstream))[0] for _ in range(3)]
    assert outcomes == ["miss", "miss", "hit"]  # a new body: remembered, then looked up and stored
    assert (step.monitor.total.stores, step.monitor.total.not_admitted) == (9, 1)
    # An answer stored before the gate turned selective is still read: admission gates stores only.
    assert [(await serve(step, request(False, max_tokens=1), upstream))[0] for _ in range(2)] == [
        "hit",
        "hit",
    ]
    assert upstream.calls == 8 + 2


async def test_a_counted_completion_is_stored_only_when_every_choice_finished(
    step: ResponseCacheStep,
) -> None:
    body = b'{"id":"x","choices":[]}'

    async def two_choices(responder: Responder) -> Completion:
        await responder.send_json(body, [])
        return Completion(body=body, finish_reasons=["stop"], choices=2)

    await step.respond(request(False), None, None, [], AsgiResponder(_ignore, lambda: None), two_choices)
    await step.drain()
    assert (step.monitor.total.stores, step.monitor.total.not_stored) == (0, 1)


async def _ignore(message: Message) -> None:
    del message


async def test_one_tenants_flood_of_unique_requests_leaves_another_tenants_gate_alone() -> None:
    store = ResponseCache(TieredStore.from_config(StoreConfig()))
    step = ResponseCacheStep(store, admission=AdmissionGate("adaptive", window_lookups=8))
    upstream = json_upstream()
    for number in range(8):  # a window of unique requests, none hit: this tenant's gate turns selective
        await serve(step, request(False, max_tokens=number + 1), upstream)
    assert step.admission_for("tenant").selective
    other = request(False, max_tokens=100)
    other.tenant_id, other.cache_salt = "other", "other-salt"
    assert [(await serve(step, other, upstream))[0] for _ in range(2)] == ["miss", "hit"]  # stored at once
    assert not step.admission_for("other").selective
