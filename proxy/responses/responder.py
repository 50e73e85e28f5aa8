"""`ResponsesResponder`: the pipeline's chat answer, sent on as a Responses answer.

The pipeline serves a translated request as a chat completion and hands the answer to this
`Responder` (through the response cache's recorder, so the cache stores and replays chat answers):

    send_json      the chat completion -> one response object
    start_stream   -> `response.created`, `response.in_progress`, then each chunk as below
    send_chunk     text -> `response.output_item.added` + `response.content_part.added` (once), then
                   `response.output_text.delta`; a tool call -> `response.output_item.added` (a
                   `function_call` item), then `response.function_call_arguments.delta`
    end_stream     every open item's `.done` events, then `response.completed` (or
                   `response.incomplete` when the answer hit `max_output_tokens`); after a failure
                   midway, an `error` event and `response.failed`

Events go out as OpenAI frames them (`event: <type>` then `data: <json>`), each with its
`sequence_number`, and no `[DONE]`. A response with `store` is stored before its last event is sent,
so a follow-up that names it finds it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from proxy.asgi_types import Send
from proxy.errors import ErrorDetail
from proxy.responder import Headers
from proxy.responses.schema import ChatProbe, ChatUsage, chat_probe
from proxy.responses.store import ResponseStore
from proxy.responses.translate import function_call_item, message_item, output_items
from proxy.responses.turn import Call, Turn, new_id
from proxy.routes.asgi_responder import SSE_HEADERS, AsgiResponder

logger = logging.getLogger("radixgate.responses")
_encoder = msgspec.json.Encoder()


class _OpenCall:
    __slots__ = ("arguments", "call_id", "item_id", "name", "output_index")

    def __init__(self, item_id: str, call_id: str, name: str, output_index: int) -> None:
        self.item_id, self.call_id, self.name, self.output_index = item_id, call_id, name, output_index
        self.arguments = ""


class ResponsesResponder:
    """Writes one Responses answer through ASGI `send` (see the module docstring)."""

    def __init__(self, send: Send, before_last: Callable[[], None], turn: Turn, store: ResponseStore) -> None:
        self._send = send
        self._before_last = before_last
        self._json = AsgiResponder(send, before_last)
        self._turn = turn
        self._store = store
        self._sequence = 0
        self._text: list[str] = []
        self._message_id: str | None = None
        self._message_index = 0
        self._calls: dict[int, _OpenCall] = {}
        self._outputs = 0
        self._finish_reason: str | None = None
        self._usage: ChatUsage | None = None
        self._model: str | None = None

    # ---- whole answers -------------------------------------------------------------------------

    async def send_json(self, body: bytes, headers: Headers) -> None:
        chat = chat_probe.decode(body)
        choice = chat.choices[0] if chat.choices else None
        message = choice.message if choice is not None else None
        text = message.content if message is not None else None
        calls: list[Call] = [
            (call.id or new_id("call"), call.function.name or "", call.function.arguments or "")
            for call in (message.tool_calls or [] if message is not None else [])
            if call.function is not None
        ]
        ids = [new_id("msg")] * bool(text) + [new_id("fc") for _ in calls]
        output = output_items(text, calls, ids)
        response = self._turn.response(
            "completed",
            output,
            chat.usage,
            model=chat.model,
            finish_reason=choice.finish_reason if choice is not None else None,
        )
        body = _encoder.encode(response)
        await self._keep(body, text, calls)
        await self._json.send_json(body, headers)

    async def send_stream(self, headers: Headers, chunks: Sequence[bytes]) -> None:
        await self.start_stream(headers, chunks[0])
        for chunk in chunks[1:]:
            await self.send_chunk(chunk)
        await self.end_stream()

    # ---- streams -------------------------------------------------------------------------------

    async def start_stream(self, headers: Headers, first: bytes) -> None:
        await self._send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]})
        response = self._turn.response("in_progress", [])
        await self._event("response.created", {"response": response})
        await self._event("response.in_progress", {"response": response})
        await self.send_chunk(first)

    async def send_chunk(self, payload: bytes) -> None:
        chunk: ChatProbe = chat_probe.decode(payload)
        if self._model is None:
            self._model = chunk.model
        if chunk.usage is not None:
            self._usage = chunk.usage
        for choice in chunk.choices:
            if choice.finish_reason:
                self._finish_reason = choice.finish_reason
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                await self._text_delta(delta.content)
            for call in delta.tool_calls or ():
                await self._call_delta(call.index, call.id, call.function)

    async def end_stream(self, error: ErrorDetail | None = None) -> None:
        if error is not None:
            await self._event(
                "error", {"code": error.code or error.type, "message": error.message, "param": error.param}
            )
            response = self._turn.response("failed", self._output("incomplete"), self._usage, error=error)
            await self._event("response.failed", {"response": response}, last=True)
            return
        text = "".join(self._text) if self._message_id is not None else None
        if self._message_id is not None:
            done = {"item_id": self._message_id, "output_index": self._message_index, "content_index": 0}
            part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
            await self._event("response.output_text.done", {**done, "text": text, "logprobs": []})
            await self._event("response.content_part.done", {**done, "part": part})
            await self._event(
                "response.output_item.done",
                {
                    "output_index": self._message_index,
                    "item": message_item(self._message_id, text, "completed"),
                },
            )
        for call in self._calls.values():
            await self._event(
                "response.function_call_arguments.done",
                {"item_id": call.item_id, "output_index": call.output_index, "arguments": call.arguments},
            )
            item = function_call_item(call.item_id, call.call_id, call.name, call.arguments, "completed")
            await self._event("response.output_item.done", {"output_index": call.output_index, "item": item})
        response = self._turn.response(
            "completed",
            self._output("completed"),
            self._usage,
            model=self._model,
            finish_reason=self._finish_reason,
        )
        calls = [(c.call_id, c.name, c.arguments) for c in self._calls.values()]
        body = _encoder.encode(response)
        await self._keep(body, text, calls)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        await self._event(kind, {"response": msgspec.Raw(body)}, last=True)

    # ---- helpers -------------------------------------------------------------------------------

    async def _text_delta(self, text: str) -> None:
        if self._message_id is None:
            self._message_id, self._message_index = new_id("msg"), self._outputs
            self._outputs += 1
            where = {"output_index": self._message_index}
            item = message_item(self._message_id, None, "in_progress")
            await self._event("response.output_item.added", {**where, "item": item})
            part = {"type": "output_text", "text": "", "annotations": []}
            await self._event(
                "response.content_part.added",
                {"item_id": self._message_id, **where, "content_index": 0, "part": part},
            )
        self._text.append(text)
        await self._event(
            "response.output_text.delta",
            {
                "item_id": self._message_id,
                "output_index": self._message_index,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            },
        )

    async def _call_delta(self, index: int, call_id: str | None, function: Any) -> None:
        call = self._calls.get(index)
        if call is None:
            name = (function.name if function is not None else None) or ""
            call = self._calls[index] = _OpenCall(
                new_id("fc"), call_id or new_id("call"), name, self._outputs
            )
            self._outputs += 1
            item = function_call_item(call.item_id, call.call_id, call.name, "", "in_progress")
            await self._event("response.output_item.added", {"output_index": call.output_index, "item": item})
        arguments = function.arguments if function is not None else None
        if arguments:
            call.arguments += arguments
            await self._event(
                "response.function_call_arguments.delta",
                {"item_id": call.item_id, "output_index": call.output_index, "delta": arguments},
            )

    def _output(self, status: str) -> list[dict[str, Any]]:
        items: list[tuple[int, dict[str, Any]]] = []
        if self._message_id is not None:
            items.append((self._message_index, message_item(self._message_id, "".join(self._text), status)))
        for c in self._calls.values():
            items.append(
                (c.output_index, function_call_item(c.item_id, c.call_id, c.name, c.arguments, status))
            )
        return [item for _, item in sorted(items, key=lambda pair: pair[0])]

    async def _keep(self, response: bytes, text: str | None, calls: list[Call]) -> None:
        turn = self._turn
        if not turn.request.store:
            return
        try:
            await self._store.run(
                self._store.put, turn.tenant_id, turn.id, turn.stored(response, text, calls)
            )
        except Exception:  # the answer is whole: a store that fails loses the row, not the answer
            logger.exception("storing response %s failed", turn.id)

    async def _event(self, kind: str, fields: dict[str, Any], *, last: bool = False) -> None:
        payload = _encoder.encode({"type": kind, "sequence_number": self._sequence, **fields})
        self._sequence += 1
        if last:
            self._before_last()
        frame = b"".join((b"event: ", kind.encode(), b"\ndata: ", payload, b"\n\n"))
        await self._send({"type": "http.response.body", "body": frame, "more_body": not last})
