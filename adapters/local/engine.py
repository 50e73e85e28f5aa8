"""`LocalEngine`: the embedded CPU engine behind the `Engine` protocol.

The async side is thin: it turns a request into token ids and sampling settings (`prepare`),
hands a `GenerationJob` to the engine thread (`EngineCore`), and reads the job's events from an
asyncio queue that the engine thread fills with `loop.call_soon_threadsafe`. Closing a stream
early cancels the job, which releases its KV pages before the engine's next step.

Weights load in a worker thread (`start`), so the event loop keeps serving while they do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from adapters.base import Completion, EngineRequest
from adapters.errors import EngineError, InvalidRequest
from adapters.local.assembly import LoadedEngine, assemble
from adapters.local.config import LocalEngineConfig
from adapters.local.core import EngineStats
from adapters.local.delivery import Mailboxes
from adapters.local.grammar import OutputGrammar
from adapters.local.loader import LoadedModel, load_model
from adapters.local.offload import OffloadStats
from adapters.local.openai_format import ResponseWriter
from adapters.local.prepare import PreparedRequest, prepare
from adapters.local.sampling import SamplingParams
from adapters.local.sequence import ChoiceDelta, GenerationJob, JobEvent, JobFailed, PromptGroup
from adapters.schema import ChatCompletionRequest, GenerationRequest, PassThroughRequest


@dataclass(slots=True)
class Generation:
    """The result of `LocalEngine.generate`."""

    token_ids: list[int] = field(default_factory=list)
    """Generated tokens, including a final EOS or stop token."""
    text: str = ""
    finish_reason: str | None = None
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""
    accepted_drafts: int = 0
    """Speculative draft tokens the model agreed with."""


class LocalEngine:
    """A Llama-family GGUF served from this process, with radix prefix reuse and continuous batching."""

    provider_name = "radixgate.local"
    server_address = "local"
    server_port: int | None = None

    def __init__(self, config: LocalEngineConfig, model: LoadedModel | None = None) -> None:
        """`model`: weights already loaded (shared between engines); None loads them in `start`."""
        config.validate()
        self.config = config
        self._model = model
        self.model_id = config.model_id
        self._loaded: LoadedEngine | None = None
        self._load_lock = threading.Lock()
        self._loading: concurrent.futures.Future[LoadedEngine] | None = None
        self._job_ids = itertools.count(1)
        self._mailboxes: Mailboxes[list[JobEvent]] = Mailboxes()

    async def start(self) -> None:
        """Load weights and start the engine thread, off the event loop. Idempotent; a caller that
        gives up (a health check's timeout) does not stop the load, the next caller joins it."""
        if self._loaded is None:
            self._loaded = await asyncio.shield(asyncio.wrap_future(self._begin_load()))

    def start_sync(self) -> None:
        """Blocking `start`, for scripts and benchmarks without an event loop."""
        if self._loaded is None:
            self._loaded = self._begin_load().result()

    def _begin_load(self) -> concurrent.futures.Future[LoadedEngine]:
        with self._load_lock:
            if self._loading is None:
                future: concurrent.futures.Future[LoadedEngine] = concurrent.futures.Future()

                def load() -> None:
                    try:
                        future.set_result(self._load())
                    except BaseException as exc:  # the waiter re-raises it
                        future.set_exception(exc)

                threading.Thread(target=load, name="radixgate-local-load", daemon=True).start()
                self._loading = future
            return self._loading

    def _load(self) -> LoadedEngine:
        if self._model is None:
            self._model = load_model(self.config)
        return assemble(self.config, self._model)

    def stats(self) -> EngineStats | None:
        """Pool, cache and queue figures; None before `start`."""
        return self._loaded.core.stats() if self._loaded is not None else None

    def kv_offload_stats(self) -> OffloadStats | None:
        """Counters of the KV offload store (L2/L3); None before `start` or with offload off."""
        offload = self._loaded.offload if self._loaded is not None else None
        return offload.stats() if offload is not None else None

    def encode_prompt(self, params: GenerationRequest) -> list[list[int]]:
        """The token ids this engine would run for each prompt of `params` (for routing)."""
        loaded = self._require()
        return [g.prompt for g in prepare(params, loaded.tokenizer, loaded.template, loaded.limits).groups]

    async def generate_stream(
        self,
        prompt: list[int],
        params: SamplingParams,
        *,
        n: int = 1,
        salt: str = "",
        speculate: bool | None = None,
        sliding_window: bool | None = None,
    ) -> AsyncIterator[list[ChoiceDelta]]:
        """Token-level generation (no OpenAI framing): each engine step's deltas, for tools and
        benchmarks. Choices are indexed 0..n-1; closing the iterator cancels the work.
        `speculate`: None takes the config's `speculative`; `sliding_window`: attend with the
        configured window (None: the engine's default)."""
        await self.start()
        loaded = self._require()
        windowed = self._windowed(sliding_window)
        if not prompt or (not windowed and len(prompt) + params.max_tokens > loaded.limits.max_context):
            raise InvalidRequest("the prompt plus max_tokens must fit the model's context", param="prompt")
        if not 1 <= n <= loaded.limits.max_n:
            raise InvalidRequest(f"n must be between 1 and {loaded.limits.max_n}", param="n")
        group = PromptGroup(prompt=prompt, first_index=0, n=n)
        prepared = PreparedRequest(groups=[group], params=params, prompt_tokens=len(prompt), echo=None)
        job_id, queue = self._submit(prepared, salt, speculate=speculate, windowed=windowed)
        open_choices = n
        try:
            while open_choices:
                deltas = _raise_failure(await queue.get())
                open_choices -= sum(d.finish_reason is not None for d in deltas)
                yield deltas
        finally:
            if open_choices:
                loaded.core.cancel(job_id)

    async def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        *,
        salt: str = "",
        speculate: bool | None = None,
        sliding_window: bool | None = None,
    ) -> Generation:
        """One choice to the end, as token ids and text."""
        result = Generation()
        async for deltas in self.generate_stream(
            prompt, params, salt=salt, speculate=speculate, sliding_window=sliding_window
        ):
            for delta in deltas:
                result.token_ids.append(delta.token_id)
                result.text += delta.text
                if delta.finish_reason is not None:
                    result.finish_reason = delta.finish_reason
                    result.cached_tokens = delta.cached_tokens
                    result.accepted_drafts = delta.accepted_drafts
        return result

    async def complete(self, request: EngineRequest) -> Completion:
        """Run a request to the end and return the OpenAI body."""
        await self.start()
        await self._build_grammar_vocabulary(request)
        prepared, writer, grammar, windowed = self._prepare(request)
        job_id, queue = self._submit(
            prepared, request.cache_salt, speculate=request.speculation, windowed=windowed, grammar=grammar
        )
        try:
            while not writer.done:
                writer.add(_raise_failure(await queue.get()))
        finally:
            if not writer.done:
                self._require().core.cancel(job_id)
        return Completion(
            body=writer.body(),
            usage=writer.usage(),
            response_id=writer.id,
            response_model=self.model_id,
            finish_reasons=writer.finish_reasons,
        )

    async def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        """Yield OpenAI chunk payloads; closing the iterator cancels the job and frees its pages."""
        await self.start()
        await self._build_grammar_vocabulary(request)
        prepared, writer, grammar, windowed = self._prepare(request)
        job_id, queue = self._submit(
            prepared, request.cache_salt, speculate=request.speculation, windowed=windowed, grammar=grammar
        )
        try:
            for chunk in writer.opening_chunks():
                yield chunk
            while not writer.done:
                for chunk in writer.stream_chunks(_raise_failure(await queue.get())):
                    yield chunk
            if writer.include_usage:
                yield writer.usage_chunk()
        finally:
            if not writer.done:
                self._require().core.cancel(job_id)

    async def check_health(self) -> bool:
        """Healthy once loaded and its thread runs; the first check starts the load."""
        await self.start()
        return self._loaded is not None and self._loaded.core.alive

    async def flush_cache(self) -> bool:
        """Drop every cached prefix no running request holds."""
        await self.start()
        await asyncio.wrap_future(self._require().core.flush_cache())
        return True

    async def aclose(self) -> None:
        """Stop the engine thread (after a load in progress finishes) and drop the model."""
        loading, self._loading, self._loaded = self._loading, None, None
        if loading is not None:
            with contextlib.suppress(Exception):
                loaded = await asyncio.wrap_future(loading)
                await asyncio.to_thread(loaded.stop, self.config.kv_shutdown_flush_s)

    def close_sync(self) -> None:
        """Blocking `aclose`, for scripts and benchmarks without an event loop."""
        loading, self._loading, self._loaded = self._loading, None, None
        if loading is not None:
            with contextlib.suppress(Exception):
                loading.result().stop(self.config.kv_shutdown_flush_s)

    # ---- internals -------------------------------------------------------------------------

    def _require(self) -> LoadedEngine:
        if self._loaded is None:
            raise EngineError("the local engine is not started")
        return self._loaded

    def _windowed(self, asked: bool | None) -> bool:
        """Whether a request attends with the sliding window; InvalidRequest when it asks for one
        this engine cannot run."""
        loaded = self._require()
        windowed = self.config.sliding_window if asked is None else asked
        if windowed and loaded.window is None:
            raise InvalidRequest(
                f"sliding-window attention is not available here: {loaded.window_error}",
                param="enable_sliding_window",
            )
        return windowed

    async def _build_grammar_vocabulary(self, request: EngineRequest) -> None:
        """Build the grammars' vocabulary in a worker thread the first time a request may need it
        (~0.2 s on the dev hosts), so `_prepare`'s compile on the event loop does not stall others."""
        params = request.params
        grammars = self._require().grammars
        if isinstance(params, ChatCompletionRequest) and not grammars.built and grammars.may_compile(params):
            await asyncio.to_thread(grammars.build_vocabulary)

    def _prepare(
        self, request: EngineRequest
    ) -> tuple[PreparedRequest, ResponseWriter, OutputGrammar | None, bool]:
        """The request's prompts and sampling, its answer's writer, its grammar and whether it attends
        with the sliding window (beam search does only when the request asks: beams share pages
        the window would rotate)."""
        params = request.params
        if isinstance(params, PassThroughRequest):  # the router sends it no other kind
            raise InvalidRequest(
                f"The model `{self.model_id}` does not create embeddings: the embedded engine ships no "
                "embedding model. Configure a worker that serves one (`[[workers]]`).",
                param="model",
                code="model_not_supported",
            )
        loaded = self._require()
        beams = params.use_beam_search
        if beams and request.sliding_window:
            raise InvalidRequest(
                "use_beam_search is not supported with the sliding window", param="enable_sliding_window"
            )
        windowed = not beams and self._windowed(request.sliding_window)
        prepared = prepare(params, loaded.tokenizer, loaded.template, loaded.limits, windowed=windowed)
        grammar = (
            loaded.grammars.compile(params, prepared.tools)
            if isinstance(params, ChatCompletionRequest)
            else None
        )
        if grammar is not None and prepared.params.beam_search:  # beams advance no grammar
            param = "tools" if prepared.tools is not None else "response_format"
            raise InvalidRequest(f"{param} is not supported with use_beam_search", param=param)
        options = params.stream_options
        writer = ResponseWriter(
            operation=request.operation,
            model_id=self.model_id,
            choices=sum(g.n for g in prepared.groups),
            prompt_tokens=prepared.prompt_tokens,
            tokenizer=loaded.tokenizer,
            include_usage=bool(params.stream and options is not None and options.include_usage),
            logprobs=prepared.params.logprobs,
            echo=prepared.echo,
            n=params.n,
            tools=prepared.tools,
        )
        return prepared, writer, grammar, windowed

    def _submit(
        self,
        prepared: PreparedRequest,
        salt: str,
        *,
        speculate: bool | None,
        windowed: bool,
        grammar: OutputGrammar | None = None,
    ) -> tuple[int, asyncio.Queue[list[JobEvent]]]:
        mailbox = self._mailboxes.for_loop(asyncio.get_running_loop())
        queue: asyncio.Queue[list[JobEvent]] = asyncio.Queue()

        def sink(events: list[JobEvent]) -> None:
            mailbox.post(queue, events)

        job_id = next(self._job_ids)
        job = GenerationJob(
            job_id=job_id,
            groups=prepared.groups,
            params=prepared.params,
            salt=salt,
            sink=sink,
            speculate=self.config.speculative if speculate is None else speculate,
            grammar=grammar,
            window=self._require().window if windowed else None,
        )
        self._require().core.submit(job)
        return job_id, queue


def _raise_failure(events: list[JobEvent]) -> list[ChoiceDelta]:
    deltas: list[ChoiceDelta] = []
    for event in events:
        if isinstance(event, JobFailed):
            raise event.error
        deltas.append(event)
    return deltas
