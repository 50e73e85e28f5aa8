"""A real OpenAI-compatible HTTP server on loopback, for tests of everything in front of an upstream.

It speaks HTTP/1.1 (h11) on its own event loop in a thread, answers `/v1/chat/completions`,
`/v1/completions` (JSON or SSE, `n`, `max_tokens`, `stream_options.include_usage`, `tools`: a call,
streamed as OpenAI's tool-call deltas), `/v1/embeddings` (vectors derived from each input's SHA-256,
`float` or `base64`) and `/v1/models`, records every request byte for byte, notices when a client
closes the connection before the answer is complete, and injects faults scripted per request:

    upstream.faults.append(Fault(status=429))            # the next request gets a 429
    upstream.faults.append(Fault(drop_after_chunks=2))   # ... or a connection cut mid-stream
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import h11

from tests.upstream_endpoints import embeddings, response, response_events

REPLY_WORDS = ("Hello", " from", " the", " test", " upstream", ".")
"""The answer every choice gets (one token per word), cut short by `max_tokens`."""
CACHED_TOKENS = 2
"""`usage.prompt_tokens_details.cached_tokens` the server reports."""


@dataclass
class Fault:
    """What to do to one request instead of (or while) answering it normally."""

    delay_s: float = 0.0
    """Wait this long before the response headers."""
    status: int | None = None
    """Answer with this status and an OpenAI error body."""
    message: str = "injected failure"
    chunk_delay_s: float = 0.0
    """Wait this long before each stream chunk."""
    first_token_delay_s: float = 0.0
    """Wait this long after the opening role chunk, before the first chunk that carries text."""
    drop_after_chunks: int | None = None
    """Cut the connection after this many chunks (0: before any response byte)."""
    inband_error_after_chunks: int | None = None
    """Send `data: {"error": ...}` after this many chunks, then end the stream."""


@dataclass
class ReceivedRequest:
    """One request as it arrived."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    disconnected: threading.Event = field(default_factory=threading.Event)
    """Set when the client closed the connection before the answer was complete."""
    disconnected_at: float | None = None
    received_at: float = field(default_factory=time.perf_counter)
    """When the whole request had arrived (`time.perf_counter()`, comparable within the process)."""
    first_token_sent_at: float | None = None
    """When the first stream chunk carrying text was written."""

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class UpstreamServer:
    """Start with `start()`, stop with `stop()`; `url` is its base URL (without `/v1`)."""

    def __init__(self, models: tuple[str, ...] = ("test-model",), *, responses_api: bool = False) -> None:
        """`responses_api`: also serve `/v1/responses` (else it is a 404, as on a chat-only server)."""
        self.models = models
        self.responses_api = responses_api
        self.metrics: str | None = None
        """Prometheus text served at `GET /metrics` (a 404 while None, as with metrics disabled)."""
        self.faults: collections.deque[Fault] = collections.deque()
        self.requests: list[ReceivedRequest] = []
        self.connections_opened = 0
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="upstream-server", daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UpstreamServer:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._connection, "127.0.0.1", 0, backlog=1024), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def generation_requests(self) -> list[ReceivedRequest]:
        return [r for r in self.requests if r.path.endswith("completions")]

    # ---- HTTP ------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_opened += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                received = await _read_request(conn, reader)
                if received is None:
                    return
                self.requests.append(received)
                watcher = asyncio.ensure_future(_wait_eof(reader))
                try:
                    handled = asyncio.ensure_future(self._answer(conn, writer, received))
                    done, _ = await asyncio.wait({handled, watcher}, return_when=asyncio.FIRST_COMPLETED)
                    if watcher in done:
                        received.disconnected_at = time.monotonic()
                        received.disconnected.set()
                        handled.cancel()
                        return
                    if not handled.result():
                        return
                finally:
                    watcher.cancel()
                    await asyncio.wait({watcher})
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.CancelledError):
            return
        finally:
            writer.close()

    async def _answer(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: ReceivedRequest
    ) -> bool:
        """Answer one request; False when the connection must be dropped."""
        if request.path.rstrip("/").endswith("/v1/models") and request.method == "GET":
            listing = {
                "object": "list",
                "data": [{"id": m, "object": "model", "owned_by": "test"} for m in self.models],
            }
            await _send_json(conn, writer, 200, listing)
            return True
        if request.method == "GET" and request.path.startswith("/health"):  # SGLang's and vLLM's probes
            await _send_json(conn, writer, 200, {"status": "ok"})
            return True
        if request.method == "GET" and request.path == "/metrics":
            if self.metrics is None:
                await _send_json(conn, writer, 404, {"detail": "Not Found"})
            else:
                await _send(conn, writer, 200, self.metrics.encode(), "text/plain; version=0.0.4")
            return True
        if request.path.startswith("/v1/responses"):
            if not self.responses_api:
                await _send_json(conn, writer, 404, {"error": {"message": "Not Found", "type": "not_found"}})
                return True
            if request.method == "DELETE":
                deleted = {"id": request.path.rsplit("/", 1)[1], "object": "response", "deleted": True}
                await _send_json(conn, writer, 200, deleted)
                return True
        fault = self.faults.popleft() if self.faults else Fault()
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault.drop_after_chunks == 0:
            writer.transport.abort()
            return False
        if fault.status is not None:
            error = {
                "message": fault.message,
                "type": "injected_error",
                "param": "messages",
                "code": "injected",
            }
            await _send_json(conn, writer, fault.status, {"error": error})
            return True
        try:
            body = json.loads(request.body)
        except ValueError:
            await _send_json(
                conn, writer, 400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}}
            )
            return True
        if request.path == "/v1/responses":
            if "input" not in body:
                await _send_json(
                    conn, writer, 400, {"error": {"message": "input is required", "param": "input"}}
                )
                return True
            words, finish = _words({"max_tokens": body.get("max_output_tokens")})
            answer = response(body, next(self._ids), words, finish, CACHED_TOKENS)
            if not body.get("stream"):
                await _send_json(conn, writer, 200, answer)
                return True
            headers = [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
            writer.write(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
            for event in response_events(answer):
                frame = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                writer.write(conn.send(h11.Data(data=frame)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
            return True
        if request.path.endswith("/embeddings"):
            await _send_json(conn, writer, 200, embeddings(body))
            return True
        chat = request.path.endswith("/chat/completions")
        if not body.get("stream"):
            await _send_json(conn, writer, 200, _completion(body, chat, next(self._ids)))
            return True
        return await self._stream(conn, writer, request, body, chat, fault)

    async def _stream(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        request: ReceivedRequest,
        body: dict[str, Any],
        chat: bool,
        fault: Fault,
    ) -> bool:
        headers = [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
        writer.write(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        for sent, chunk in enumerate(_chunks(body, chat, next(self._ids))):
            if fault.drop_after_chunks is not None and sent >= fault.drop_after_chunks:
                await writer.drain()
                writer.transport.abort()
                return False
            if fault.inband_error_after_chunks is not None and sent >= fault.inband_error_after_chunks:
                error = {
                    "error": {"message": fault.message, "type": "BadRequestError", "param": None, "code": 400}
                }
                writer.write(conn.send(h11.Data(data=f"data: {json.dumps(error)}\n\n".encode())) or b"")
                break
            if fault.chunk_delay_s:
                await asyncio.sleep(fault.chunk_delay_s)
            choices = chunk["choices"]
            carries_text = any(c.get("text") or (c.get("delta") or {}).get("content") for c in choices)
            if carries_text and request.first_token_sent_at is None and fault.first_token_delay_s:
                await asyncio.sleep(fault.first_token_delay_s)
            writer.write(conn.send(h11.Data(data=f"data: {json.dumps(chunk)}\n\n".encode())) or b"")
            await writer.drain()
            if carries_text and request.first_token_sent_at is None:
                request.first_token_sent_at = time.perf_counter()
        else:
            writer.write(conn.send(h11.Data(data=b"data: [DONE]\n\n")) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
        return True


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> ReceivedRequest | None:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            conn.receive_data(data)
            if not data and request is None:
                return None
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            headers = {name.decode().lower(): value.decode() for name, value in request.headers}
            return ReceivedRequest(request.method.decode(), request.target.decode(), headers, bytes(body))
        elif isinstance(event, h11.ConnectionClosed):
            return None


async def _wait_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(1024):
        pass


async def _send_json(conn: h11.Connection, writer: asyncio.StreamWriter, status: int, payload: Any) -> None:
    await _send(conn, writer, status, json.dumps(payload).encode(), "application/json")


async def _send(
    conn: h11.Connection, writer: asyncio.StreamWriter, status: int, data: bytes, content_type: str
) -> None:
    headers = [("content-type", content_type), ("content-length", str(len(data)))]
    writer.write(
        (conn.send(h11.Response(status_code=status, headers=headers)) or b"")
        + (conn.send(h11.Data(data=data)) or b"")
    )
    writer.write(conn.send(h11.EndOfMessage()) or b"")
    await writer.drain()


# ---- OpenAI wire format ---------------------------------------------------------------------


def _words(body: dict[str, Any]) -> tuple[list[str], str]:
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    words = list(REPLY_WORDS[:limit] if limit else REPLY_WORDS)
    return words, "length" if limit and limit < len(REPLY_WORDS) else "stop"


def _usage(body: dict[str, Any], completion_tokens: int) -> dict[str, Any]:
    prompt = json.dumps(body.get("messages") or body.get("prompt") or "")
    prompt_tokens = max(1, len(prompt.split()))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
    }


def _tool_call(body: dict[str, Any]) -> dict[str, Any] | None:
    tools = body.get("tools")
    if not tools or body.get("tool_choice") == "none":
        return None
    name = tools[0]["function"]["name"]
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": '{"city": "Paris"}'}}


def _completion(body: dict[str, Any], chat: bool, number: int) -> dict[str, Any]:
    words, finish = _words(body)
    n = body.get("n", 1)
    tool_call = _tool_call(body) if chat else None
    choices: list[dict[str, Any]] = []
    for index in range(n):
        if chat and tool_call is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
            choices.append(
                {"index": index, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
            )
        elif chat:
            message = {"role": "assistant", "content": "".join(words)}
            choices.append({"index": index, "message": message, "logprobs": None, "finish_reason": finish})
        else:
            choices.append(
                {"index": index, "text": "".join(words), "logprobs": None, "finish_reason": finish}
            )
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{number}",
        "object": "chat.completion" if chat else "text_completion",
        "created": 1700000000 + number,
        "model": body.get("model"),
        "system_fingerprint": "fp_upstream",
        "choices": choices,
        "usage": _usage(body, len(words) * n),
    }


def _chunks(body: dict[str, Any], chat: bool, number: int) -> list[dict[str, Any]]:
    """Every chunk of a streamed answer, as OpenAI orders them."""
    words, finish = _words(body)
    n = body.get("n", 1)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    base = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{number}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 1700000000 + number,
        "model": body.get("model"),
        "system_fingerprint": "fp_upstream",
    }

    def chunk(index: int, content: dict[str, Any] | str, finish_reason: str | None) -> dict[str, Any]:
        if chat:
            choice = {"index": index, "delta": content, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": content, "logprobs": None, "finish_reason": finish_reason}
        payload = {**base, "choices": [choice]}
        if include_usage:
            payload["usage"] = None
        return payload

    chunks: list[dict[str, Any]] = []
    if chat:
        chunks += [chunk(i, {"role": "assistant", "content": ""}, None) for i in range(n)]
    tool_call = _tool_call(body) if chat else None
    if tool_call is not None:  # OpenAI's deltas: id, type and name first, then the arguments in pieces
        function = tool_call["function"]
        opening = {**tool_call, "index": 0, "function": {"name": function["name"], "arguments": ""}}
        arguments = function["arguments"]
        pieces = [arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]]
        for i in range(n):
            chunks.append(chunk(i, {"tool_calls": [opening]}, None))
            chunks += [
                chunk(i, {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}, None) for p in pieces
            ]
            chunks.append(chunk(i, {}, "tool_calls"))
        if include_usage:
            chunks.append({**base, "choices": [], "usage": _usage(body, 0)})
        return chunks
    for word in words:
        chunks += [chunk(i, {"content": word} if chat else word, None) for i in range(n)]
    chunks += [chunk(i, {} if chat else "", finish) for i in range(n)]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": _usage(body, len(words) * n)})
    return chunks
