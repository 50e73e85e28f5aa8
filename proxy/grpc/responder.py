"""The gRPC front door's `Responder`s: the pipeline's JSON body or chunk payloads as inference responses.

`UnaryResponder` gathers one `ModelInferResponse` (ModelInfer). `StreamResponder` writes
`ModelStreamInferResponse`s as Triton's decoupled models do: one per chunk with its new text, every
one carrying the `triton_final_response` parameter, true on the last (the prompt, when the caller
wants it, goes in front of the first one's text). The last is the chunk that
finishes the choice; with `triton_enable_empty_final_response` it is instead an extra response with
no outputs. A failure midway is one response with `error_message` (a stream reports a failed request
in-band and stays open for the caller's other requests).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from proxy.errors import ErrorDetail
from proxy.grpc.protocol import grpc_service_pb2 as pb
from proxy.grpc.tensors import answer_text, chunk_text, text_output
from proxy.responder import Headers

FINAL_RESPONSE: Final = "triton_final_response"
"""Response parameter (bool) that marks the last response of a request on a stream."""
ENABLE_EMPTY_FINAL_RESPONSE: Final = "triton_enable_empty_final_response"
"""Request parameter (bool): end with an extra response that has no outputs (tritonclient's
`async_stream_infer(..., enable_empty_final_response=True)`)."""

Write = Callable[[pb.ModelStreamInferResponse], Awaitable[None]]


def infer_response(request: pb.ModelInferRequest, text: str | None) -> pb.ModelInferResponse:
    """A response to `request` holding `text` in `text_output` (no outputs for None)."""
    response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    if text is not None:
        response.outputs.append(text_output(text))
    return response


class UnaryResponder:
    """Gathers the whole answer as one `ModelInferResponse`; `prefix` goes in front of its text."""

    __slots__ = ("_parts", "_request", "headers", "response")

    def __init__(self, request: pb.ModelInferRequest, prefix: str) -> None:
        self._request = request
        self._parts = [prefix]
        self.headers: Headers = []
        """The answer's metadata (`x-request-id`, `x-radixgate-cache`), sent as trailing metadata."""
        self.response: pb.ModelInferResponse | None = None
        """Set once the answer is complete."""

    async def send_json(self, body: bytes, headers: Headers) -> None:
        self.headers = headers
        self._parts.append(answer_text(body))
        self.response = infer_response(self._request, "".join(self._parts))

    async def start_stream(self, headers: Headers, first: bytes) -> None:
        self.headers = headers
        self._parts.append(chunk_text(first)[0])

    async def send_chunk(self, payload: bytes) -> None:
        self._parts.append(chunk_text(payload)[0])

    async def end_stream(self, error: ErrorDetail | None = None) -> None:
        if error is None:
            self.response = infer_response(self._request, "".join(self._parts))

    async def send_stream(self, headers: Headers, chunks: Sequence[bytes]) -> None:
        await self.start_stream(headers, chunks[0])
        for chunk in chunks[1:]:
            await self.send_chunk(chunk)
        await self.end_stream()


class StreamResponder:
    """Writes one request's responses to a ModelStreamInfer call through `write`."""

    __slots__ = ("_done", "_empty_final", "_prefix", "_request", "_write")

    def __init__(self, request: pb.ModelInferRequest, prefix: str, write: Write) -> None:
        self._request = request
        self._prefix = prefix
        self._write = write
        parameter = request.parameters.get(ENABLE_EMPTY_FINAL_RESPONSE)
        self._empty_final = parameter is not None and parameter.bool_param
        self._done = False

    async def send_json(self, body: bytes, headers: Headers) -> None:
        await self._text(answer_text(body), finishes=True)
        await self.end_stream()

    async def start_stream(self, headers: Headers, first: bytes) -> None:
        await self.send_chunk(first)

    async def send_chunk(self, payload: bytes) -> None:
        text, finishes = chunk_text(payload)
        if not text and not finishes:
            return  # nothing new for the caller (a role or usage chunk)
        await self._text(text, finishes)

    async def end_stream(self, error: ErrorDetail | None = None) -> None:
        if error is not None:
            await self._write(pb.ModelStreamInferResponse(error_message=error.message))
        elif self._empty_final:
            await self._send(None, final=True)
        elif not self._done:
            await self._send("", final=True)  # the stream ended without a finishing chunk

    async def send_stream(self, headers: Headers, chunks: Sequence[bytes]) -> None:
        for chunk in chunks:
            await self.send_chunk(chunk)
        await self.end_stream()

    async def _text(self, text: str, finishes: bool) -> None:
        if self._done:
            return
        if self._prefix:
            text, self._prefix = self._prefix + text, ""
        final = finishes and not self._empty_final
        await self._send(text, final=final)
        self._done = final

    async def _send(self, text: str | None, *, final: bool) -> None:
        response = infer_response(self._request, text)
        response.parameters[FINAL_RESPONSE].bool_param = final
        await self._write(pb.ModelStreamInferResponse(infer_response=response))
