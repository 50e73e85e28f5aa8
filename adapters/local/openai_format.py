"""OpenAI response shapes for the local engine: whole bodies and stream chunks.

Streaming follows OpenAI's framing: every chunk of a response shares `id` and `created`; the
first chat chunk of each choice carries `delta.role` (and `content: ""`); text arrives in
`delta.content` (chat) or `text` (completions); a choice ends with a chunk whose delta is empty
and whose `finish_reason` is set. With `stream_options.include_usage`, every chunk has
`usage: null` and a last chunk with `choices: []` carries the usage.

A chat request with tools reads each choice's text through a `CallParser`: calls come out as
`message.tool_calls` (content null) and `finish_reason` `tool_calls`; streamed, as OpenAI's deltas
(`tool_calls[i]`, i counting the choice's calls from 0: with id, type and name first, then
`function.arguments` pieces).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from adapters.local.call_parser import CallDelta, CallParser
from adapters.local.sampling import TokenLogprob
from adapters.local.sequence import ChoiceDelta
from adapters.local.tokenizer import TextTokenizer
from adapters.local.tool_calls import ToolPlan
from adapters.schema import CompletionTokensDetails, Operation, PromptTokensDetails, Usage

_encode = msgspec.json.Encoder().encode
_REFUSED = float("-inf")
"""The logprob of a token a grammar refused: never listed among the alternatives."""


class _Details(msgspec.Struct):
    cached_tokens: int


class _CompletionDetails(msgspec.Struct):
    """OpenAI's names for predicted tokens, here speculative draft tokens accepted and rejected."""

    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class _Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: _Details
    completion_tokens_details: _CompletionDetails | None = None


class _Choice:
    """Accumulated state of one choice."""

    __slots__ = ("calls", "content", "finish_reason", "logprobs", "offset", "text")

    def __init__(self, prefix: str, tools: ToolPlan | None) -> None:
        self.text: list[str] = [prefix] if prefix else []
        self.logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.offset = len(prefix)  # characters so far, for completions' text_offset
        self.calls = CallParser(tools) if tools is not None else None
        self.content: list[str] = []
        """With tools: the text that is not a call."""


class ResponseWriter:
    """Builds one response's body or chunks from the engine's `ChoiceDelta`s."""

    def __init__(
        self,
        *,
        operation: Operation,
        model_id: str,
        choices: int,
        prompt_tokens: int,
        tokenizer: TextTokenizer,
        include_usage: bool = False,
        logprobs: bool = False,
        echo: list[str] | None = None,
        n: int = 1,
        tools: ToolPlan | None = None,
    ) -> None:
        self.chat = operation == "chat"
        self.id = f"chatcmpl-{uuid.uuid4().hex}" if self.chat else f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model_id = model_id
        self.prompt_tokens = prompt_tokens
        self.tokenizer = tokenizer
        self.include_usage = include_usage
        self.logprobs = logprobs
        self._echo = [echo[i // n] for i in range(choices)] if echo else [""] * choices
        self._choices = [_Choice(prefix, tools if self.chat else None) for prefix in self._echo]
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.accepted_drafts = 0
        self.rejected_drafts = 0
        self._open = choices

    @property
    def done(self) -> bool:
        return self._open == 0

    @property
    def finish_reasons(self) -> list[str]:
        return [c.finish_reason or "stop" for c in self._choices]

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=self.cached_tokens),
            completion_tokens_details=(
                CompletionTokensDetails(
                    accepted_prediction_tokens=self.accepted_drafts,
                    rejected_prediction_tokens=self.rejected_drafts,
                )
                if self._speculated
                else None
            ),
        )

    # ---- streaming -------------------------------------------------------------------------

    def opening_chunks(self) -> list[bytes]:
        """Chunks sent before any token: each chat choice's role, or each completion's echoed prompt."""
        if self.chat:
            return [
                self._chunk([self._chunk_choice(i, {"role": "assistant", "content": ""})])
                for i in range(len(self._choices))
            ]
        return [self._chunk([self._chunk_choice(i, text)]) for i, text in enumerate(self._echo) if text]

    def stream_chunks(self, deltas: list[ChoiceDelta]) -> list[bytes]:
        """Record `deltas` and return the chunks that carry them."""
        out = []
        for delta in deltas:
            choice = self._choices[delta.index]
            offset = choice.offset
            calls = self._record(delta)
            if calls is not None:
                out.extend(self._call_chunks(delta, calls))
                continue
            if delta.text or delta.logprobs:
                body = {"content": delta.text} if self.chat else delta.text
                out.append(self._chunk([self._chunk_choice(delta.index, body, delta.logprobs, offset)]))
            if delta.finish_reason is not None:
                out.append(
                    self._chunk(
                        [self._chunk_choice(delta.index, {} if self.chat else "", finish=delta.finish_reason)]
                    )
                )
        return out

    def _call_chunks(self, delta: ChoiceDelta, calls: CallDelta) -> list[bytes]:
        """A tools request's chunks for one delta: content, or the call's opening and arguments."""
        bodies: list[dict[str, Any]] = []
        if calls.content:
            bodies.append({"content": calls.content})
        parser = self._choices[delta.index].calls
        for piece in calls.calls:
            if piece.opened and parser is not None:
                call = parser.calls[piece.index]
                opening = {
                    "index": piece.index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
                bodies.append({"tool_calls": [opening]})
            if piece.arguments:
                bodies.append(
                    {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.arguments}}]}
                )
        if delta.logprobs and not bodies:
            bodies.append({})
        out = [
            self._chunk([self._chunk_choice(delta.index, body, delta.logprobs if i == 0 else None)])
            for i, body in enumerate(bodies)
        ]
        reason = self._choices[delta.index].finish_reason
        if delta.finish_reason is not None:
            out.append(self._chunk([self._chunk_choice(delta.index, {}, finish=reason)]))
        return out

    def usage_chunk(self) -> bytes:
        """The last chunk when `include_usage` is on: no choices, the usage."""
        return _encode(
            self._envelope("chat.completion.chunk" if self.chat else "text_completion", [], self._usage())
        )

    def _chunk(self, choices: list[dict[str, Any]]) -> bytes:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return _encode(self._envelope(obj, choices, None if self.include_usage else msgspec.UNSET))

    def _chunk_choice(
        self,
        index: int,
        body: dict[str, str] | str,
        logprobs: list[TokenLogprob] | None = None,
        offset: int = 0,
        finish: str | None = None,
    ) -> dict[str, Any]:
        lp = self._logprobs(logprobs, offset) if logprobs else None
        if self.chat:
            return {"index": index, "delta": body, "logprobs": lp, "finish_reason": finish}
        return {"index": index, "text": body, "logprobs": lp, "finish_reason": finish}

    # ---- whole body --------------------------------------------------------------------------

    def add(self, deltas: list[ChoiceDelta]) -> None:
        """Record `deltas` for `body`."""
        for delta in deltas:
            self._record(delta)

    def body(self) -> bytes:
        """The non-streaming response body."""
        choices = []
        for index, choice in enumerate(self._choices):
            text = "".join(choice.text)
            lp = self._logprobs(choice.logprobs, len(self._echo[index])) if self.logprobs else None
            if self.chat:
                message = self._message(choice, text)
                choices.append(
                    {
                        "index": index,
                        "message": message,
                        "logprobs": lp,
                        "finish_reason": choice.finish_reason,
                    }
                )
            else:
                choices.append(
                    {"index": index, "text": text, "logprobs": lp, "finish_reason": choice.finish_reason}
                )
        return _encode(
            self._envelope("chat.completion" if self.chat else "text_completion", choices, self._usage())
        )

    @staticmethod
    def _message(choice: _Choice, text: str) -> dict[str, Any]:
        calls = choice.calls
        if calls is None:
            return {"role": "assistant", "content": text}
        if not calls.called:
            return {"role": "assistant", "content": "".join(choice.content)}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls.calls
            ],
        }

    # ---- shared ------------------------------------------------------------------------------

    def _record(self, delta: ChoiceDelta) -> CallDelta | None:
        """Record `delta`; with tools, also what it adds to the choice's content or call."""
        choice = self._choices[delta.index]
        calls = None
        if choice.calls is not None:
            calls = choice.calls.push(delta.text)
            if delta.finish_reason is not None:
                calls.extend(choice.calls.finish())
            choice.content.append(calls.content)
        if delta.text:
            choice.text.append(delta.text)
        choice.logprobs.extend(delta.logprobs)
        for entry in delta.logprobs:
            choice.offset += len(self.tokenizer.piece(entry.token_id))
        if delta.finish_reason is not None:
            called = choice.calls is not None and choice.calls.called
            choice.finish_reason = (
                "tool_calls" if called and delta.finish_reason == "stop" else delta.finish_reason
            )
            self.completion_tokens += delta.completion_tokens
            self.cached_tokens += delta.cached_tokens
            self.accepted_drafts += delta.accepted_drafts
            self.rejected_drafts += delta.rejected_drafts
            self._open -= 1
        return calls

    def _envelope(self, obj: str, choices: list[dict[str, Any]], usage: object) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model_id}
        out["choices"] = choices
        if usage is not msgspec.UNSET:
            out["usage"] = usage
        return out

    def _usage(self) -> _Usage:
        return _Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
            prompt_tokens_details=_Details(cached_tokens=self.cached_tokens),
            completion_tokens_details=(
                _CompletionDetails(self.accepted_drafts, self.rejected_drafts) if self._speculated else None
            ),
        )

    @property
    def _speculated(self) -> bool:
        """Draft tokens were verified for this answer: its usage says how many were accepted."""
        return self.accepted_drafts + self.rejected_drafts > 0

    def _logprobs(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
        tok = self.tokenizer
        if self.chat:
            return {
                "content": [
                    {
                        "token": tok.piece(e.token_id),
                        "logprob": e.logprob,
                        "bytes": list(tok.token_bytes[e.token_id]),
                        "top_logprobs": [
                            {"token": tok.piece(t), "logprob": lp, "bytes": list(tok.token_bytes[t])}
                            for t, lp in e.top
                            if lp > _REFUSED
                        ],
                    }
                    for e in entries
                ],
                "refusal": None,
            }
        offsets = []
        for e in entries:
            offsets.append(offset)
            offset += len(tok.piece(e.token_id))
        return {
            "tokens": [tok.piece(e.token_id) for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{tok.piece(t): lp for t, lp in e.top if lp > _REFUSED} for e in entries],
            "text_offset": offsets,
        }
