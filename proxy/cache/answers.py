"""A response-cache miss's answer and a hit's replay: what of an answer is stored, and how.

`Recorder` keeps a copy of a stream as its ASGI messages pass; `stored_response` turns a recorded
stream or the `Completion` a JSON answer came back as into the `StoredResponse` to keep, or None
when the answer is not complete (`complete_answer`); `replay` sends a stored answer again.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from adapters.base import Completion
from adapters.sse import DONE, SSEDecoder
from cachelayer.responses import StoredResponse
from proxy.asgi_types import Message, Send
from proxy.errors import JSON
from proxy.streaming import DONE_EVENT, SSE_HEADERS, sse_event

Headers = list[tuple[bytes, bytes]]


def stored_response(answer: Recorder | Completion) -> StoredResponse | None:
    """What to store of a recorded stream or a whole JSON answer; None when it is not complete."""
    if isinstance(answer, Recorder):
        return answer.response()
    counted, finished, usage = answer.choices, answer.finish_reasons, answer.usage
    if counted is None:  # the adapter did not count its choices: read them from the body
        tokens = complete_answer([answer.body])
        return None if tokens is None else StoredResponse.json_body(answer.body, *tokens)
    if counted == 0 or len(finished) != counted:
        return None
    if usage is None:
        return StoredResponse.json_body(answer.body)
    return StoredResponse.json_body(answer.body, usage.prompt_tokens, usage.completion_tokens)


async def replay(send: Send, stored: StoredResponse, headers: Headers) -> None:
    """Send a stored answer: one JSON body, or every chunk as an SSE event then `[DONE]`."""
    if stored.streamed:
        body = b"".join([*(sse_event(chunk) for chunk in stored.chunks), DONE_EVENT])
        start = [*SSE_HEADERS, *headers]
    else:
        body = stored.body
        start = [*headers, (b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": start})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Recorder:
    """Passes a stream's ASGI messages through and keeps a copy of them."""

    __slots__ = ("_next", "finished", "parts", "status")

    def __init__(self, send: Send) -> None:
        self._next = send
        self.status = 0
        self.parts: list[bytes] = []
        self.finished = False

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
        elif kind == "http.response.body":
            self.parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                self.finished = True
        await self._next(message)

    def response(self) -> StoredResponse | None:
        """The stream to store, or None when it failed, was cut, or is not complete."""
        if self.status != 200 or not self.finished:
            return None
        decoder = SSEDecoder()
        events = [event for part in self.parts for event in decoder.feed(part)] + decoder.flush()
        if not events or events[-1].data != DONE:
            return None
        chunks = [event.data for event in events[:-1]]
        tokens = complete_answer(chunks)
        return None if tokens is None else StoredResponse.stream(chunks, *tokens)


class AnswerTokens(NamedTuple):
    prompt_tokens: int
    completion_tokens: int


class _ChoiceEnd(msgspec.Struct):
    index: int = 0
    finish_reason: str | None = None


class _TokenCounts(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _AnswerProbe(msgspec.Struct):
    """Only what `complete_answer` reads: a third of `probe_response`'s cost on a typical body (no
    strings kept, the error object left undecoded)."""

    choices: list[_ChoiceEnd] = []
    usage: _TokenCounts | None = None
    error: msgspec.Raw = msgspec.Raw(b"")


_answer_decoder = msgspec.json.Decoder(_AnswerProbe)
_NULL = b"null"


def complete_answer(payloads: list[bytes]) -> AnswerTokens | None:
    """Token counts when `payloads` (a body, or a stream's chunks) are a whole, error-free answer:
    no error object, and every choice that appears has a finish reason. None otherwise."""
    if len(payloads) == 1:  # a JSON body: every choice must be finished in it
        try:
            probe = _answer_decoder.decode(payloads[0])
        except msgspec.DecodeError:
            return None
        if (len(probe.error) and bytes(probe.error) != _NULL) or not probe.choices:
            return None
        for choice in probe.choices:
            if not choice.finish_reason:
                return None
        usage = probe.usage
        return (
            AnswerTokens(0, 0)
            if usage is None
            else AnswerTokens(usage.prompt_tokens, usage.completion_tokens)
        )
    seen: set[int] = set()
    finished: set[int] = set()
    tokens = AnswerTokens(0, 0)
    for payload in payloads:
        try:
            probe = _answer_decoder.decode(payload)
        except msgspec.DecodeError:
            return None
        error = probe.error
        if len(error) and bytes(error) != _NULL:
            return None
        for choice in probe.choices:
            seen.add(choice.index)
            if choice.finish_reason:
                finished.add(choice.index)
        if probe.usage is not None:
            tokens = AnswerTokens(probe.usage.prompt_tokens, probe.usage.completion_tokens)
    if not seen or seen != finished:
        return None
    return tokens
