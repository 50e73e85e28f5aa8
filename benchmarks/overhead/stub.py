"""A fast OpenAI-compatible upstream stub on raw asyncio protocols (uvloop).

Answers `GET` (the gateway's `/v1/models` health check) with a one-model list, every POST with a
fixed chat completion, or, when the body asks for `"stream": true`,
with `--chunks` SSE chunks spaced `--chunk-interval-ms` apart (the first one at once) and
`[DONE]`. It parses only what it needs (headers, Content-Length), keeps connections alive and
costs a few tens of microseconds per request, so it never limits the gateway it stands behind.

    python -m benchmarks.overhead.stub --port 9100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from typing import cast

import uvloop

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "stub-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 10, "total_tokens": 22},
    },
    separators=(",", ":"),
).encode()
JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(
    COMPLETION
)
MODELS = b'{"object":"list","data":[{"id":"stub-model","object":"model","owned_by":"bench"}]}'
MODELS_RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(MODELS),
    MODELS,
)
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_STREAM_RE = re.compile(rb'"stream"\s*:\s*true')
_LENGTH_RE = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


def _chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk carrying one SSE event."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def _stream_chunks(count: int) -> list[bytes]:
    chunks = []
    for i in range(count):
        last = i == count - 1
        delta = {} if last else {"content": f"tok{i} "}
        payload = {
            "id": "chatcmpl-stub",
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": "stub-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if last else None}],
        }
        chunks.append(_chunk(json.dumps(payload, separators=(",", ":")).encode()))
    chunks.append(_chunk(b"[DONE]") + b"0\r\n\r\n")
    return chunks


class StubProtocol(asyncio.Protocol):
    def __init__(self, chunks: list[bytes], interval: float) -> None:
        self.chunks = chunks
        self.interval = interval
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            match = _LENGTH_RE.search(self.buffer, 0, end + 2)
            length = int(match.group(1)) if match else 0
            total = end + 4 + length
            if len(self.buffer) < total:
                return
            body = self.buffer[end + 4 : total]
            is_get = self.buffer.startswith(b"GET ")
            self.buffer = self.buffer[total:]
            self.respond(body, is_get)

    def respond(self, body: bytes, is_get: bool) -> None:
        assert self.transport is not None
        if is_get:  # GET /v1/models, the gateway's health check
            self.transport.write(MODELS_RESPONSE)
        elif _STREAM_RE.search(body):
            asyncio.get_running_loop().create_task(self.stream())
        else:
            self.transport.write(JSON_HEAD + COMPLETION)

    async def stream(self) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(STREAM_HEAD + self.chunks[0])
        for chunk in self.chunks[1:]:
            if self.interval:
                await asyncio.sleep(self.interval)
            if transport.is_closing():
                return
            transport.write(chunk)


async def serve(host: str, port: int, chunks: int, interval_ms: float) -> None:
    loop = asyncio.get_running_loop()
    body_chunks = _stream_chunks(chunks)
    server = await loop.create_server(
        lambda: StubProtocol(body_chunks, interval_ms / 1000), host, port, backlog=4096
    )
    print(f"stub listening on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--chunks", type=int, default=20, help="content chunks per stream, before [DONE]")
    parser.add_argument("--chunk-interval-ms", type=float, default=5.0)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.chunks, args.chunk_interval_ms))


if __name__ == "__main__":
    main()
