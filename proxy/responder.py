"""`Responder`: where the request pipeline sends an answer, whatever the front door.

The pipeline (`proxy.pipeline`) produces an answer as one JSON body or as a stream of chunk payloads
(each an OpenAI JSON object, without framing), plus response metadata (`x-request-id`,
`x-radixgate-cache`). A front door implements `Responder` to put that on its wire: the HTTP routes
frame it as a JSON response or as Server-Sent Events (`proxy.routes.asgi_responder`); a gRPC front
door would frame it as its own messages. Wrappers (the response cache's recorder, the cached
endpoints' decorator) implement it too and pass everything on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from proxy.errors import ErrorDetail

Headers = list[tuple[bytes, bytes]]
"""Response metadata as lower-case (name, value) byte pairs."""
REQUEST_ID_HEADER = b"x-request-id"
"""The request's id, in every answer (the caller's own when it sent a usable one)."""


class Responder(Protocol):
    """One request's answer sink. Exactly one of `send_json`, `send_stream`, or `start_stream` then
    any `send_chunk`s then `end_stream`, is called per request, and nothing after that."""

    async def send_json(self, body: bytes, headers: Headers) -> None:
        """A whole JSON answer (status 200)."""
        ...

    async def start_stream(self, headers: Headers, first: bytes) -> None:
        """A stream whose first chunk has arrived (status 200 from here on)."""
        ...

    async def send_chunk(self, payload: bytes) -> None:
        """One more chunk of a started stream."""
        ...

    async def end_stream(self, error: ErrorDetail | None = None) -> None:
        """The end of a started stream; `error` when it failed midway (the client gets an error event)."""
        ...

    async def send_stream(self, headers: Headers, chunks: Sequence[bytes]) -> None:
        """A whole stream at once (a replayed cache hit): `start_stream`, the chunks, `end_stream`."""
        ...
