"""A simulated engine worker that speaks SGLang's HTTP API (see `sim_core` for the cost model).

    python -m benchmarks.routing.sim_engine --port 30001 --tokenizer PATH --time-scale 0.1

Endpoints: `POST /generate` (text or `input_ids`; streaming sends cumulative `text`), the OpenAI
`POST /v1/chat/completions` and `/v1/completions` (usage with `prompt_tokens_details.cached_tokens`),
`GET /v1/models`, `/health`, `/health_generate`, `/server_info` and `/get_server_info`,
`/get_model_info`, `/metrics` (`sglang:` names), `POST /flush_cache` (400 while busy) and
`POST /tokenize`. It is a plain ASGI app on uvicorn, so many instances fit on two cores.

`--offer-tokenizer` says how much of its tokenizer the worker lets a router find, as real servers
differ: `path` (its tokenizer's path in `/server_info`, as SGLang, plus `/tokenize`), `tokenize`
(`/tokenize` only: the path is on another host) or `none` (neither: an OpenAI-compatible server).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import msgspec
import uvicorn

from adapters.schema import ChatCompletionRequest
from benchmarks.routing.sim_core import PromptTooLong, SimConfig, SimEngine, SimRequest
from benchmarks.routing.sim_http import (
    CompletionBody,
    GenerateBody,
    Receive,
    Scope,
    Send,
    read_body,
    send_body,
    send_json,
    sse,
    start_sse,
)
from benchmarks.routing.sim_kv import SimKvEvents, kv_events_config
from benchmarks.routing.sim_tokens import SimTokens
from proxy.routing.tokenizing import (
    ByteTokenizer,
    ChatRenderer,
    HFTokenizer,
    load_chat_template,
    load_tokenizer,
)

DEFAULT_MAX_NEW_TOKENS = 128
KEEP_ALIVE_S = 75


class SimServer:
    """Routes HTTP requests to one `SimEngine`."""

    def __init__(
        self,
        engine: SimEngine,
        tokenizer: HFTokenizer | ByteTokenizer,
        model: str,
        chat: ChatRenderer,
        offer: str = "path",
        kv_events_config: str | None = None,
    ):
        self.offer = offer
        self.kv_events_config = kv_events_config
        self.engine = engine
        self.tokenizer = tokenizer
        self.model = model
        self.chat = chat
        self.tokens = SimTokens(tokenizer, chat)
        self.started = time.time()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        body = await read_body(receive) if method == "POST" else b""
        try:
            await self._route(path, method, body, receive, send)
        except (msgspec.ValidationError, msgspec.DecodeError, PromptTooLong, ValueError) as exc:
            await send_json(
                send, 400, {"object": "error", "message": str(exc), "type": "BadRequestError", "code": 400}
            )

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.engine.kv_events is not None:
                    self.engine.kv_events.start()
                self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.engine.stop()
                if self.engine.kv_events is not None:
                    await self.engine.kv_events.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, path: str, method: str, body: bytes, receive: Receive, send: Send) -> None:
        if path in ("/health", "/health_generate"):
            await send_body(send, 200, b"", "text/plain")
        elif path in ("/server_info", "/get_server_info"):
            await send_json(send, 200, self._server_info())
        elif path == "/get_model_info":
            await send_json(
                send,
                200,
                {"model_path": self.model, "tokenizer_path": self.tokenizer.source, "is_generation": True},
            )
        elif path == "/v1/models":
            await send_json(
                send,
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.model,
                            "object": "model",
                            "created": int(self.started),
                            "owned_by": "sglang",
                            "max_model_len": self.engine.config.capacity_tokens,
                        }
                    ],
                },
            )
        elif path == "/metrics":
            await send_body(send, 200, self._metrics().encode(), "text/plain; version=0.0.4")
        elif path == "/flush_cache":
            if self.engine.flush():
                await send_body(send, 200, b"Cache flushed.\n", "text/plain")
            else:
                await send_body(
                    send, 400, b"Cache not flushed. Please check if the server is idle.\n", "text/plain"
                )
        elif path == "/tokenize" and method == "POST" and self.offer != "none":
            prompt = msgspec.json.decode(body).get("prompt", "")
            tokens = self.tokenizer.encode_now(prompt)
            await send_json(
                send,
                200,
                {"tokens": tokens, "count": len(tokens), "max_model_len": self.engine.config.capacity_tokens},
            )
        elif path == "/generate" and method == "POST":
            await self._generate(msgspec.json.decode(body, type=GenerateBody), receive, send)
        elif path == "/v1/chat/completions" and method == "POST":
            chat = msgspec.json.decode(body, type=ChatCompletionRequest)
            tokens = self.tokens.chat(chat.messages)
            await self._openai(
                "chat",
                chat.token_limit,
                chat.stream,
                chat.stream_options is not None and chat.stream_options.include_usage,
                tokens,
                receive,
                send,
                chat.cache_salt if isinstance(chat.cache_salt, str) else None,
            )
        elif path == "/v1/completions" and method == "POST":
            completion = msgspec.json.decode(body, type=CompletionBody)
            prompt = completion.prompt
            tokens = (
                self.tokenizer.encode_now(prompt)
                if isinstance(prompt, str)
                else [int(t) for t in prompt if isinstance(t, int)]
            )
            await self._openai(
                "text_completion",
                completion.max_tokens,
                completion.stream,
                completion.stream_options is not None and completion.stream_options.include_usage,
                tokens,
                receive,
                send,
                completion.cache_salt,
            )
        else:
            await send_json(send, 404, {"detail": "Not Found"})

    # ---- generation -------------------------------------------------------------------------

    async def _run(
        self, tokens: list[int], max_new: int, receive: Receive, salt: str | None = None
    ) -> tuple[SimRequest, asyncio.Task[None]]:
        request = self.engine.submit(tokens, max_new, self.tokens.output_vocab, salt or "")
        watcher = asyncio.create_task(_abort_on_disconnect(receive, self.engine, request))
        return request, watcher

    async def _generate(self, body: GenerateBody, receive: Receive, send: Send) -> None:
        if body.input_ids is not None:
            tokens = [int(t) for t in body.input_ids if isinstance(t, int)]
        else:
            text = body.text if isinstance(body.text, str) else (body.text or [""])[0]
            tokens = self.tokenizer.encode_now(text)
        max_new = int(body.sampling_params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
        rid = body.rid or uuid.uuid4().hex
        request, watcher = await self._run(tokens, max_new, receive, body.extra_key)
        try:
            if not body.stream:
                await _wait_finished(request)
                await send_json(send, 200, self._native_chunk(request, rid))
                return
            await start_sse(send)
            while not request.finished:
                await request.updates.get()
                await sse(send, msgspec.json.encode(self._native_chunk(request, rid)))
            await sse(send, b"[DONE]", more=False)
        finally:
            watcher.cancel()

    def _native_chunk(self, request: SimRequest, rid: str) -> dict[str, Any]:
        finish = {"type": "length", "length": len(request.output)} if request.finished else None
        return {
            "text": self.tokens.detokenize(request.output),
            "output_ids": list(request.output),
            "meta_info": {
                "id": rid,
                "finish_reason": finish,
                "prompt_tokens": len(request.prompt),
                "completion_tokens": len(request.output),
                "cached_tokens": request.cached_tokens,
            },
        }

    async def _openai(
        self,
        operation: str,
        max_new: int | None,
        stream: bool,
        include_usage: bool,
        tokens: list[int],
        receive: Receive,
        send: Send,
        salt: str | None = None,
    ) -> None:
        request, watcher = await self._run(tokens, max_new or DEFAULT_MAX_NEW_TOKENS, receive, salt)
        prefix = "chatcmpl" if operation == "chat" else "cmpl"
        base = {"id": f"{prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.model}
        try:
            if not stream:
                await _wait_finished(request)
                text = self.tokens.detokenize(request.output)
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
                if operation == "chat":
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                obj = "chat.completion" if operation == "chat" else "text_completion"
                await send_json(
                    send, 200, {**base, "object": obj, "choices": [choice], "usage": _usage(request)}
                )
                return
            await start_sse(send)
            obj = "chat.completion.chunk" if operation == "chat" else "text_completion"
            sent = ""
            while not request.finished:
                await request.updates.get()
                text = self.tokens.detokenize(request.output)
                delta, sent = text[len(sent) :], text
                finish = "length" if request.finished else None
                piece: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
                if operation == "chat":
                    piece["delta"] = {"role": "assistant", "content": delta}
                else:
                    piece["text"] = delta
                await sse(
                    send, msgspec.json.encode({**base, "object": obj, "choices": [piece], "usage": None})
                )
            if include_usage:
                await sse(
                    send,
                    msgspec.json.encode({**base, "object": obj, "choices": [], "usage": _usage(request)}),
                )
            await sse(send, b"[DONE]", more=False)
        finally:
            watcher.cancel()

    # ---- introspection ----------------------------------------------------------------------

    def _server_info(self) -> dict[str, Any]:
        config = self.engine.config
        paths = {"tokenizer_path": self.tokenizer.source} if self.offer == "path" else {}
        return {
            **paths,
            "model_path": self.model,
            "served_model_name": self.model,
            "max_total_num_tokens": config.capacity_tokens,
            "kv_events_config": self.kv_events_config,
            "max_running_requests": config.max_running,
            "page_size": 1,
            "stream_interval": config.stream_interval,
            "version": "sim",
            "status": "ready",
            "internal_states": [{"last_gen_throughput": 0.0, "max_total_num_tokens": config.capacity_tokens}],
        }

    def _metrics(self) -> str:
        engine, stats = self.engine, self.engine.stats
        hit = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
        label = f'{{model_name="{self.model}"}}'
        rows = [
            ("sglang:num_running_reqs", "gauge", len(engine.running)),
            ("sglang:num_queue_reqs", "gauge", len(engine.waiting)),
            ("sglang:token_usage", "gauge", engine.token_usage),
            ("sglang:cache_hit_rate", "gauge", hit),
            ("sglang:num_requests_total", "counter", stats.requests),
            ("sglang:prompt_tokens_total", "counter", stats.prompt_tokens),
            ("sglang:cached_tokens_total", "counter", stats.cached_tokens),
            ("sglang:generation_tokens_total", "counter", stats.generation_tokens),
            ("sglang:sim_busy_seconds_total", "counter", stats.busy_s),
        ]
        lines: list[str] = []
        for name, kind, value in rows:
            lines += [
                f"# TYPE {name.removesuffix('_total') if kind == 'counter' else name} {kind}",
                f"{name}{label} {value}",
            ]
        return "\n".join(lines) + "\n"


def _usage(request: SimRequest) -> dict[str, Any]:
    prompt, completion = len(request.prompt), len(request.output)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": request.cached_tokens},
    }


async def _wait_finished(request: SimRequest) -> None:
    while not request.finished:
        await request.updates.get()


async def _abort_on_disconnect(receive: Receive, engine: SimEngine, request: SimRequest) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            engine.abort(request)
            return


def build_app(
    config: SimConfig,
    tokenizer_spec: str | None,
    model: str,
    offer: str = "path",
    kv_events_port: int | None = None,
) -> SimServer:
    """The ASGI app of one simulated worker; with `kv_events_port`, it publishes its cache's KV
    events there (PUB) and replays them on the next port (ROUTER), as vLLM does."""
    tokenizer = load_tokenizer(tokenizer_spec)
    chat = ChatRenderer(load_chat_template(tokenizer_spec))
    kv = SimKvEvents.on_loopback(kv_events_port) if kv_events_port is not None else None
    advert = kv_events_config(kv_events_port) if kv_events_port is not None else None
    return SimServer(SimEngine(config, kv), tokenizer, model, chat, offer, advert)


def main(argv: list[str] | None = None) -> None:
    """Run one simulated worker until interrupted."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="sim-model")
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json or .gguf; default: UTF-8 bytes")
    parser.add_argument("--offer-tokenizer", choices=("path", "tokenize", "none"), default="path")
    parser.add_argument(
        "--kv-events-port", type=int, default=None, help="publish KV events here (replay: the next port)"
    )
    defaults = SimConfig()
    for name in SimConfig.__dataclass_fields__:
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=type(getattr(defaults, name)), default=getattr(defaults, name))
    args = parser.parse_args(argv)
    config = SimConfig(**{name: getattr(args, name) for name in SimConfig.__dataclass_fields__})
    app = build_app(config, args.tokenizer, args.model, args.offer_tokenizer, args.kv_events_port)
    # Keep idle connections longer than any client pool does, so a reused connection is never a closed one.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
    )


if __name__ == "__main__":
    main()
