"""Token ids of a request for the routing trees: templated, tokenized, salted by tenant.

Each model gets its tokenizer from `RoutingSettings.tokenizers` (see `proxy.routing.tokenizing`), or,
when none is configured, from the first worker seen up that serves it (`proxy.routing.discovery`);
"engine" asks a worker's `/tokenize`; anything that fails falls back to UTF-8 bytes for that request.
A non-empty tenant salt becomes one leading pseudo-token, so two tenants' identical prompts never
share a path in any tree (the engines get the salt as `cache_salt` and do not share KV either).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence

from adapters.base import EngineRequest
from adapters.engine_metrics import Tokenizes
from adapters.schema import ChatCompletionRequest, PassThroughRequest
from proxy.routing.discovery import Discovered, discover_tokenizer
from proxy.routing.tokenizing import (
    ByteTokenizer,
    ChatRenderer,
    HFTokenizer,
    load_chat_template,
    load_tokenizer,
    prompt_of,
)
from proxy.routing.worker import Worker

logger = logging.getLogger("radixgate.routing.prompts")

ENGINE_TOKENIZER = "engine"
THREAD_TOKENIZE_CHARS = 4_096
"""New prompt text this long or longer is tokenized off the event loop (`tokenizers` releases the GIL;
below it, a thread hop costs more than the encoding)."""
_SALT_CACHE_SIZE = 1024
SEGMENT_CACHE_ENTRIES = 4096
"""Tokenized chat messages kept (LRU); system prompts and histories hit it again and again."""


class PromptTokens:
    """Per-model tokenizers and chat renderers, loaded lazily on first use."""

    def __init__(self, tokenizers: Mapping[str, str], expected_output_tokens: int) -> None:
        self._specs = dict(tokenizers)
        self._expected_output_tokens = expected_output_tokens
        self._local: dict[str, HFTokenizer | ByteTokenizer] = {}
        self._renderers: dict[str, ChatRenderer] = {}
        self._bytes = ByteTokenizer()
        self._salts: dict[str, int] = {}
        self._segment_cache: OrderedDict[tuple[str, str], array[int]] = OrderedDict()
        self._pending: dict[tuple[str, str], asyncio.Future[array[int]]] = {}
        """Segments being encoded right now, awaited by requests that need them too."""
        self._discovered: dict[str, Discovered] = {}
        """Per unconfigured model, what its workers offered (`discover`)."""

    def kind(self, model: str) -> str:
        """The tokenizer kind used for `model`, as `GET /admin/workers` reports it."""
        if self._uses_engine(model):
            return "engine"
        return self._tokenizer(model).kind

    def source(self, model: str) -> str:
        """Where `model`'s tokenizer came from: "config", or the discovered source (a path, a
        worker's `/tokenize`, "utf-8")."""
        if model in self._specs:
            return "config"
        found = self._discovered.get(model)
        return found.source if found is not None else "utf-8"

    def sources(self, models: Sequence[str]) -> dict[str, str]:
        """`source` for each model."""
        return {model: self.source(model) for model in models}

    async def discover(self, worker: Worker, timeout_s: float) -> None:
        """Ask a worker that came up for the tokenizer of each unconfigured model it serves, unless
        an exact one was found already (a worker that offers only bytes never replaces another's)."""
        for model in worker.models:
            if model in self._specs:
                continue
            known = self._discovered.get(model)
            if known is not None and known.kind != "bytes":
                continue
            found = await discover_tokenizer(worker, timeout_s)
            self._discovered[model] = found
            if found.kind != "bytes":
                # Segments encoded as bytes before this (a request raced the first health check).
                for key in [key for key in self._segment_cache if key[0] == model]:
                    del self._segment_cache[key]
            if found.tokenizer is not None:
                self._local[model] = found.tokenizer
                self._renderers[model] = ChatRenderer(found.template)
            logger.info("routing tokenizer of %s: %s (%s)", model, found.kind, found.source)

    def _uses_engine(self, model: str) -> bool:
        if model in self._specs:
            return self._specs[model] == ENGINE_TOKENIZER
        found = self._discovered.get(model)
        return found is not None and found.kind == "engine"

    def kinds(self, models: Sequence[str]) -> dict[str, str]:
        """`kind` for each model."""
        return {model: self.kind(model) for model in models}

    def expected_output(self, request: EngineRequest) -> int:
        """The request's output budget, or the configured default."""
        limit = request.params.token_limit
        return limit if limit is not None and limit > 0 else self._expected_output_tokens

    async def tokens(self, request: EngineRequest, candidates: Sequence[Worker]) -> tuple[array[int], str]:
        """Salted token ids of the request's templated prompt, and the tokenizer kind that made them."""
        model = request.model
        ids: Sequence[int] | None = request.prompt_token_ids
        kind = "request"
        if ids is None:
            renderer = self._renderer(model)
            segments = None
            if isinstance(request.params, ChatCompletionRequest):
                segments = renderer.segments(request.params.messages)
            if segments is not None:
                try:
                    ids, kind = await self._encode_segments(model, segments, candidates)
                except Exception as exc:  # an engine's /tokenize failing: bytes for this request
                    if not self._uses_engine(model):
                        raise
                    logger.debug("tokenize for %s failed: %r", model, exc)
                    ids, kind = self._bytes.encode_array("".join(segments)), "bytes"
            elif isinstance(request.params, PassThroughRequest):  # routed by load alone: no prompt
                ids = []
            else:
                prompt = prompt_of(request.params, renderer)
                if isinstance(prompt, list):
                    ids = prompt
                else:
                    ids, kind = await self._encode(model, prompt, candidates)
        try:
            body = _uint32(ids)
        except OverflowError:  # negative or huge ids from a client: route on bytes instead
            body = self._bytes.encode_array(str(list(ids)))
        if request.cache_salt:
            return array("I", (self._salt_token(request.cache_salt),)) + body, kind
        return body, kind

    async def _encode(self, model: str, text: str, candidates: Sequence[Worker]) -> tuple[Sequence[int], str]:
        if self._uses_engine(model):
            try:
                return (await self._engine_encode([text], candidates))[0], "engine"
            except Exception as exc:  # the engine's tokenizer is an optimisation
                logger.debug("tokenize for %s failed: %r", model, exc)
                return self._bytes.encode_array(text), "bytes"
        tokenizer = self._tokenizer(model)
        if isinstance(tokenizer, ByteTokenizer):
            return tokenizer.encode_array(text), tokenizer.kind
        if len(text) > THREAD_TOKENIZE_CHARS and isinstance(tokenizer, HFTokenizer):
            return await asyncio.to_thread(tokenizer.encode_now, text), tokenizer.kind
        return tokenizer.encode_now(text), tokenizer.kind

    async def _engine_encode(self, texts: list[str], candidates: Sequence[Worker]) -> list[list[int]]:
        """Token ids of each text from the first candidate's `/tokenize` (raises when none can)."""
        for worker in candidates:
            engine = worker.engine
            if isinstance(engine, Tokenizes):
                return list(await asyncio.gather(*(engine.tokenize(text) for text in texts)))
        raise LookupError("no candidate worker tokenizes")

    async def _encode_segments(
        self, model: str, segments: Sequence[str], candidates: Sequence[Worker]
    ) -> tuple[array[int], str]:
        """Tokenize message by message through a cache: a system prompt or a conversation's history
        repeats across requests and is tokenized once (a BPE merge never crosses a ChatML marker).
        New text of `THREAD_TOKENIZE_CHARS` or more is encoded on a worker thread, so a long unique
        prompt neither stalls the event loop nor leaves the other core idle.
        A segment already being encoded for another request is awaited, not encoded again: a burst of
        requests sharing a new system prompt (a cold start) tokenizes it once, not once per request."""
        kind, key, encode = self._segment_encoder(model, candidates)
        cache = self._segment_cache
        found: list[array[int] | None] = []
        for segment in segments:
            ids = cache.get((key, segment))
            if ids is not None:
                cache.move_to_end((key, segment))
            found.append(ids)
        pending = self._pending
        mine = list(dict.fromkeys(s for s, ids in zip(segments, found, strict=True) if ids is None))
        theirs = {s: pending[(key, s)] for s in mine if (key, s) in pending}
        mine = [s for s in mine if s not in theirs]
        if mine:
            futures = {s: asyncio.get_running_loop().create_future() for s in mine}
            for segment, future in futures.items():
                pending[(key, segment)] = future
            try:
                encoded = await encode(mine)
            except BaseException as exc:
                for segment, future in futures.items():
                    del pending[(key, segment)]
                    future.set_exception(exc)
                    future.exception()  # retrieved here: a waiter is optional
                raise
            for segment, raw in zip(mine, encoded, strict=True):
                ids = _uint32(raw)
                del pending[(key, segment)]
                futures[segment].set_result(ids)
                cache[(key, segment)] = ids
                if len(cache) > SEGMENT_CACHE_ENTRIES:
                    cache.popitem(last=False)
        done = {s: await future for s, future in theirs.items()}
        tokens = array("I")
        for segment, ids in zip(segments, found, strict=True):
            if ids is None:
                ids = done.get(segment) or cache.get((key, segment))
                if ids is None:  # evicted between its encoding and now (a burst over the cache size)
                    ids = array("I", (await encode([segment]))[0])
            tokens.extend(ids)
        return tokens, kind

    def _segment_encoder(
        self, model: str, candidates: Sequence[Worker]
    ) -> tuple[str, str, Callable[[list[str]], Awaitable[Sequence[Sequence[int]]]]]:
        """The kind, the segment cache's namespace and the batch encoder for `model`'s segments."""
        if self._uses_engine(model):
            if any(isinstance(w.engine, Tokenizes) for w in candidates):
                return "engine", model, lambda texts: self._engine_encode(texts, candidates)
            # No candidate tokenizes now: bytes, cached apart from the engine's ids.
            return "bytes", f"{model}\0bytes", self._bytes_encode
        tokenizer = self._tokenizer(model)
        if not isinstance(tokenizer, HFTokenizer):
            return tokenizer.kind, model, self._bytes_encode

        async def encode(texts: list[str]) -> Sequence[Sequence[int]]:
            if sum(map(len, texts)) >= THREAD_TOKENIZE_CHARS:
                return await asyncio.to_thread(tokenizer.encode_many, texts)
            return [tokenizer.encode_now(text) for text in texts]

        return tokenizer.kind, model, encode

    async def _bytes_encode(self, texts: list[str]) -> Sequence[Sequence[int]]:
        return [self._bytes.encode_array(text) for text in texts]

    def load(self) -> None:
        """Load every configured model's tokenizer and chat template now (blocking: a GGUF vocabulary
        takes seconds), so no request or admin call pays for it on the event loop."""
        for model, spec in self._specs.items():
            if spec != ENGINE_TOKENIZER:
                self._tokenizer(model)
                self._renderer(model)

    def _tokenizer(self, model: str) -> HFTokenizer | ByteTokenizer:
        tokenizer = self._local.get(model)
        if tokenizer is None:
            spec = self._specs.get(model)
            try:
                tokenizer = load_tokenizer(None if spec == ENGINE_TOKENIZER else spec)
            except (OSError, ValueError, RuntimeError) as exc:
                logger.warning("tokenizer for %s unusable (%s); routing on UTF-8 bytes", model, exc)
                tokenizer = self._bytes
            self._local[model] = tokenizer
        return tokenizer

    def _renderer(self, model: str) -> ChatRenderer:
        renderer = self._renderers.get(model)
        if renderer is None:
            spec = self._specs.get(model)
            try:
                renderer = ChatRenderer(load_chat_template(None if spec == ENGINE_TOKENIZER else spec))
            except (OSError, ValueError, RuntimeError) as exc:
                logger.warning("chat template for %s unusable (%s); using ChatML", model, exc)
                renderer = ChatRenderer(None)
            self._renderers[model] = renderer
        return renderer

    def _salt_token(self, salt: str) -> int:
        token = self._salts.get(salt)
        if token is None:
            if len(self._salts) >= _SALT_CACHE_SIZE:
                self._salts.clear()
            token = int.from_bytes(hashlib.sha256(salt.encode()).digest()[:4], "little")
            self._salts[salt] = token
        return token


def _uint32(ids: Sequence[int]) -> array[int]:
    """`ids` as the uint32 array the trees take: as is when it already is one (byte ids, benchmarks,
    callers that keep such arrays), else copied (~20 ns per token; OverflowError past uint32)."""
    if isinstance(ids, array) and ids.typecode == "I":
        return ids
    return array("I", ids)
