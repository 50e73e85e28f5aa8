"""`NativeResponder`: a worker's own `/v1/responses` answer, relayed to the client.

Used when every worker of the model serves the Responses API itself (`WorkerSpec.responses_api`).
The worker's JSON body goes out as it came; its stream's events go out framed as OpenAI frames them
(`event: <type>` from each event's `type`, then its data), unchanged. The final response object (the
body, or the `response` of the `response.completed`, `response.incomplete` or `response.failed` event)
is stored for the tenant before it is sent, with the worker that holds the conversation, so `GET`
answers from the gateway and a follow-up goes to that worker only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from adapters.base import RouteHint
from proxy.asgi_types import Send
from proxy.errors import ErrorDetail
from proxy.responder import Headers
from proxy.responses.store import ResponseStore, StoredTurn
from proxy.routes.asgi_responder import SSE_HEADERS, AsgiResponder

logger = logging.getLogger("radixgate.responses")
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _Event(msgspec.Struct):
    type: str = "message"
    sequence_number: int = 0
    response: msgspec.Raw | None = None


class _Body(msgspec.Struct):
    id: str | None = None


_event = msgspec.json.Decoder(_Event)
_body = msgspec.json.Decoder(_Body)
_encoder = msgspec.json.Encoder()


class NativeResponder:
    """Relays one native Responses answer through ASGI `send` (see the module docstring)."""

    def __init__(
        self,
        send: Send,
        before_last: Callable[[], None],
        tenant_id: str,
        store: ResponseStore | None,
        route: RouteHint,
        input_items: bytes = b"[]",
    ) -> None:
        """`store` None: the request asked not to be stored (`store: false`); `input_items`: the
        response's input items as stored (JSON)."""
        self._send = send
        self._before_last = before_last
        self._json = AsgiResponder(send, before_last)
        self._tenant_id = tenant_id
        self._store = store
        self._route = route
        self._input_items = input_items
        self._sequence = -1

    async def send_json(self, body: bytes, headers: Headers) -> None:
        await self._keep(body)
        await self._json.send_json(body, headers)

    async def send_stream(self, headers: Headers, chunks: Sequence[bytes]) -> None:
        await self.start_stream(headers, chunks[0])
        for chunk in chunks[1:]:
            await self.send_chunk(chunk)
        await self.end_stream()

    async def start_stream(self, headers: Headers, first: bytes) -> None:
        await self._send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]})
        await self.send_chunk(first)

    async def send_chunk(self, payload: bytes) -> None:
        try:
            event = _event.decode(payload)
        except msgspec.DecodeError:
            event = _Event()
        self._sequence = event.sequence_number
        if event.type in FINAL_EVENTS and event.response is not None:
            await self._keep(bytes(event.response))
        await self._frame(event.type, payload, more=True)

    async def end_stream(self, error: ErrorDetail | None = None) -> None:
        self._before_last()
        if error is None:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        fields: dict[str, Any] = {
            "code": error.code or error.type,
            "message": error.message,
            "param": error.param,
        }
        payload = _encoder.encode({"type": "error", "sequence_number": self._sequence + 1, **fields})
        await self._frame("error", payload, more=False)

    async def _frame(self, kind: str, payload: bytes, *, more: bool) -> None:
        frame = b"".join((b"event: ", kind.encode(), b"\ndata: ", payload, b"\n\n"))
        await self._send({"type": "http.response.body", "body": frame, "more_body": more})

    async def _keep(self, response: bytes) -> None:
        if self._store is None:
            return
        try:
            response_id = _body.decode(response).id
        except msgspec.DecodeError:
            return
        if response_id is None:
            return
        turn = StoredTurn(response, b"[]", self._route.served_by, native=True, input_items=self._input_items)
        try:
            await self._store.run(self._store.put, self._tenant_id, response_id, turn)
        except Exception:  # the answer is whole: a store that fails loses the row, not the answer
            logger.exception("storing response %s failed", response_id)
