"""A response-cache miss's answer and a hit's replay: what of an answer is stored, and how.

`Recorder` keeps a copy of a stream as it passes to the front door's `Responder`; `stored_response`
turns a recorded stream or the `Completion` a JSON answer came back as into the `StoredResponse` to
keep, or None when the answer is not complete (`complete_answer`); `replay` sends a stored answer again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from adapters.base import Completion
from cachelayer.responses import StoredResponse
from proxy.errors import ErrorDetail
from proxy.responder import Headers, Responder


def stored_response(answer: Recorder | Completion) -> StoredResponse | None:
    """What to store of a recorded stream or a whole JSON answer; None when it is not complete."""
    if isinstance(answer, Recorder):
        return answer.response()
    counted, finished, usage = answer.choices, answer.finish_reasons, answer.usage
    if answer.whole:
        return StoredResponse.json_body(answer.body, usage.prompt_tokens if usage else 0)
    if counted is None:  # the adapter did not count its choices: read them from the body
        tokens = complete_answer([answer.body])
        return None if tokens is None else StoredResponse.json_body(answer.body, *tokens)
    if counted == 0 or len(finished) != counted:
        return None
    if usage is None:
        return StoredResponse.json_body(answer.body)
    return StoredResponse.json_body(answer.body, usage.prompt_tokens, usage.completion_tokens)


async def replay(responder: Responder, stored: StoredResponse, headers: Headers) -> None:
    """Send a stored answer: one JSON body, or the whole stream at once."""
    if stored.streamed:
        await responder.send_stream(headers, stored.chunks)
    else:
        await responder.send_json(stored.body, headers)


class Recorder:
    """A `Responder` that passes a stream on and keeps a copy of its chunks."""

    __slots__ = ("_next", "chunks", "ended", "failed")

    def __init__(self, responder: Responder) -> None:
        self._next = responder
        self.chunks: list[bytes] = []
        self.ended = False
        self.failed = False

    async def send_json(self, body: bytes, headers: Headers) -> None:
        await self._next.send_json(body, headers)

    async def start_stream(self, headers: Headers, first: bytes) -> None:
        self.chunks.append(first)
        await self._next.start_stream(headers, first)

    async def send_chunk(self, payload: bytes) -> None:
        self.chunks.append(payload)
        await self._next.send_chunk(payload)

    async def end_stream(self, error: ErrorDetail | None = None) -> None:
        self.failed = error is not None
        await self._next.end_stream(error)
        self.ended = True

    async def send_stream(self, headers: Headers, chunks: Sequence[bytes]) -> None:
        await self._next.send_stream(headers, chunks)

    def response(self) -> StoredResponse | None:
        """The stream to store, or None when it failed, was cut, or is not complete."""
        if not self.ended or self.failed or not self.chunks:
            return None
        tokens = complete_answer(self.chunks)
        return None if tokens is None else StoredResponse.stream(self.chunks, *tokens)


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
