"""One upstream call: its GenAI CLIENT span, its GenAI histograms and its Prometheus series.

Client metrics time the call to the worker; the server metrics (`gen_ai.server.*`) time the request
as the gateway's client sees it, from when it reached the forwarder (`request_started`), retries
included, and are recorded by the attempt that succeeds."""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.metrics import Histogram, Meter
from opentelemetry.util.types import AttributeValue

from adapters.base import Engine, EngineRequest
from adapters.errors import EngineError, UpstreamStatusError
from adapters.schema import Usage
from proxy.telemetry import propagation, semconv
from proxy.telemetry.prometheus import UpstreamSeries


@dataclass(slots=True, frozen=True)
class GenAIInstruments:
    """The GenAI client histograms, created once per meter with the conventions' buckets."""

    duration: Histogram
    token_usage: Histogram
    time_to_first_chunk: Histogram
    time_per_output_chunk: Histogram
    server_duration: Histogram
    server_time_to_first_token: Histogram
    server_time_per_output_token: Histogram

    @classmethod
    def create(cls, meter: Meter) -> GenAIInstruments:
        seconds = semconv.UNIT_SECONDS
        return cls(
            duration=meter.create_histogram(
                semconv.GEN_AI_CLIENT_OPERATION_DURATION,
                unit=semconv.UNIT_SECONDS,
                description="GenAI operation duration.",
                explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
            ),
            token_usage=meter.create_histogram(
                semconv.GEN_AI_CLIENT_TOKEN_USAGE,
                unit=semconv.UNIT_TOKENS,
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=semconv.TOKEN_USAGE_BUCKETS,
            ),
            time_to_first_chunk=meter.create_histogram(
                semconv.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
                unit=semconv.UNIT_SECONDS,
                description="Time to receive the first chunk of a streaming response that carries output.",
                explicit_bucket_boundaries_advisory=semconv.TIME_TO_FIRST_CHUNK_BUCKETS,
            ),
            time_per_output_chunk=meter.create_histogram(
                semconv.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK,
                unit=seconds,
                description="Time between consecutive output chunks of a streaming response.",
                explicit_bucket_boundaries_advisory=semconv.TIME_PER_OUTPUT_CHUNK_BUCKETS,
            ),
            server_duration=meter.create_histogram(
                semconv.GEN_AI_SERVER_REQUEST_DURATION,
                unit=seconds,
                description="GenAI server request duration, to the last output token.",
                explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
            ),
            server_time_to_first_token=meter.create_histogram(
                semconv.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
                unit=seconds,
                description="Time to generate the first token, for successful streamed responses.",
                explicit_bucket_boundaries_advisory=semconv.SERVER_TIME_TO_FIRST_TOKEN_BUCKETS,
            ),
            server_time_per_output_token=meter.create_histogram(
                semconv.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
                unit=seconds,
                description="Time per output token after the first, for successful streamed responses.",
                explicit_bucket_boundaries_advisory=semconv.TIME_PER_OUTPUT_TOKEN_BUCKETS,
            ),
        )


_WORKER_ATTRIBUTES = frozenset((semconv.SERVER_ADDRESS, semconv.SERVER_PORT))


def error_type_of(error: BaseException) -> str:
    """`error.type`: the engine's error code when it gave one, else the upstream's HTTP status,
    else the exception class name (the convention's order of preference)."""
    if isinstance(error, EngineError):
        if error.code:
            return error.code
        if isinstance(error, UpstreamStatusError):
            return str(error.upstream_status)
    return type(error).__qualname__


def request_attributes(request: EngineRequest, engine: Engine) -> dict[str, AttributeValue]:
    """The CLIENT span's attributes known before the call."""
    params = request.params
    attributes: dict[str, AttributeValue] = {
        semconv.GEN_AI_OPERATION_NAME: request.operation,
        semconv.GEN_AI_PROVIDER_NAME: engine.provider_name,
        semconv.GEN_AI_REQUEST_MODEL: params.model,
        semconv.GEN_AI_REQUEST_STREAM: params.stream,
        semconv.SERVER_ADDRESS: engine.server_address,
    }
    if engine.server_port is not None:
        attributes[semconv.SERVER_PORT] = engine.server_port
    if (max_tokens := params.token_limit) is not None:
        attributes[semconv.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    if params.temperature is not None:
        attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] = params.temperature
    if params.top_p is not None:
        attributes[semconv.GEN_AI_REQUEST_TOP_P] = params.top_p
    if params.top_k is not None:
        attributes[semconv.GEN_AI_REQUEST_TOP_K] = params.top_k
    if params.seed is not None:
        attributes[semconv.GEN_AI_REQUEST_SEED] = params.seed
    if params.n != 1:
        attributes[semconv.GEN_AI_REQUEST_CHOICE_COUNT] = params.n
    if params.stop is not None:
        attributes[semconv.GEN_AI_REQUEST_STOP_SEQUENCES] = (
            (params.stop,) if isinstance(params.stop, str) else tuple(params.stop)
        )
    if params.frequency_penalty is not None:
        attributes[semconv.GEN_AI_REQUEST_FREQUENCY_PENALTY] = params.frequency_penalty
    if params.presence_penalty is not None:
        attributes[semconv.GEN_AI_REQUEST_PRESENCE_PENALTY] = params.presence_penalty
    return attributes


class Operation:
    """Started by `Telemetry.start_operation`; ended exactly once by `succeed` or `fail`.

    Later calls to `succeed`/`fail` are ignored, so an error path may call `fail` after a
    partial success without double counting.
    """

    __slots__ = (
        "_ended",
        "_first_chunk_at",
        "_instruments",
        "_last_chunk_at",
        "_metric_attributes",
        "_series",
        "_span",
        "_started",
        "request_started",
        "times_chunks",
        "trace_headers",
    )

    def __init__(
        self,
        span: trace.Span,
        request: EngineRequest,
        engine: Engine,
        instruments: GenAIInstruments | None,
        series: UpstreamSeries,
    ) -> None:
        """`instruments` is None when no meter records (skips building metric attributes)."""
        self._span = span
        self._instruments = instruments
        self._series = series
        self._started = time.perf_counter()
        self.request_started = self._started
        """`perf_counter()` when the client's request reached the forwarder (before any retry)."""
        self._first_chunk_at: float | None = None
        self._last_chunk_at = 0.0
        self.times_chunks = instruments is not None
        """True when `next_chunk` records (a meter is configured): the caller may skip calling it."""
        self._ended = False
        self._metric_attributes: dict[str, AttributeValue] = {}
        if instruments is not None:
            self._metric_attributes = {
                semconv.GEN_AI_OPERATION_NAME: request.operation,
                semconv.GEN_AI_PROVIDER_NAME: engine.provider_name,
                semconv.GEN_AI_REQUEST_MODEL: request.params.model,
                semconv.SERVER_ADDRESS: engine.server_address,
            }
            if engine.server_port is not None:
                self._metric_attributes[semconv.SERVER_PORT] = engine.server_port
        self.trace_headers: dict[str, str] = {}
        """W3C `traceparent`/`tracestate` naming this CLIENT span as the upstream's parent."""
        propagation.inject(span, self.trace_headers)

    def first_chunk(self) -> None:
        """Mark the arrival of the first streamed chunk that carries output (later calls are ignored)."""
        if self._first_chunk_at is not None or self._ended:
            return
        now = self._first_chunk_at = self._last_chunk_at = time.perf_counter()
        elapsed = now - self._started
        self._series.time_to_first_chunk.observe(elapsed)
        if self._instruments is not None:
            self._instruments.time_to_first_chunk.record(elapsed, self._metric_attributes)
        if self._span.is_recording():
            self._span.set_attribute(semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, elapsed)

    def next_chunk(self) -> None:
        """Mark a later output chunk: one `time_per_output_chunk` sample (when a meter records)."""
        if self._instruments is None or self._first_chunk_at is None or self._ended:
            return
        now = time.perf_counter()
        self._instruments.time_per_output_chunk.record(now - self._last_chunk_at, self._metric_attributes)
        self._last_chunk_at = now

    def succeed(
        self,
        *,
        response_id: str | None,
        response_model: str | None,
        finish_reasons: list[str],
        usage: Usage | None,
    ) -> None:
        """End the call as a success with what the engine reported."""
        if self._ended:
            return
        self._ended = True
        elapsed = time.perf_counter() - self._started
        series = self._series
        series.success_duration.observe(elapsed)
        cached = usage.cached_tokens if usage is not None else None
        if usage is not None:
            series.input_tokens.inc(usage.prompt_tokens)
            series.output_tokens.inc(usage.completion_tokens)
            if cached is not None:
                series.cache_read_tokens.inc(cached)
        if self._instruments is not None:
            self._record_genai_metrics(elapsed, response_model, usage)
        span = self._span
        if span.is_recording():
            attributes: dict[str, AttributeValue] = {}
            if response_id:
                attributes[semconv.GEN_AI_RESPONSE_ID] = response_id
            if response_model:
                attributes[semconv.GEN_AI_RESPONSE_MODEL] = response_model
            if finish_reasons:
                attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = finish_reasons
            if usage is not None:
                attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] = usage.prompt_tokens
                attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = usage.completion_tokens
                if cached is not None:
                    attributes[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = cached
            span.set_attributes(attributes)
        span.end()

    def fail(self, error: BaseException) -> None:
        """End the call as a failure; `error.type` is the engine error code or the exception class."""
        if self._ended:
            return
        self._ended = True
        elapsed = time.perf_counter() - self._started
        error_type = error_type_of(error)
        self._series.error_duration.observe(elapsed)
        if self._instruments is not None:
            attributes = {**self._metric_attributes, semconv.ERROR_TYPE: error_type}
            self._instruments.duration.record(elapsed, attributes)
        span = self._span
        if span.is_recording():
            span.set_attribute(semconv.ERROR_TYPE, error_type)
            span.set_status(trace.StatusCode.ERROR, str(error) or error_type)
            span.record_exception(error)
        span.end()

    def _record_genai_metrics(self, elapsed: float, response_model: str | None, usage: Usage | None) -> None:
        instruments = self._instruments
        assert instruments is not None
        attributes = self._metric_attributes
        if response_model:
            attributes[semconv.GEN_AI_RESPONSE_MODEL] = response_model
        instruments.duration.record(elapsed, attributes)
        now = self._started + elapsed
        # server.address/port name the worker: the server metrics describe the gateway's own answer.
        served = {k: v for k, v in attributes.items() if k not in _WORKER_ATTRIBUTES}
        instruments.server_duration.record(now - self.request_started, served)
        if self._first_chunk_at is not None:
            instruments.server_time_to_first_token.record(self._first_chunk_at - self.request_started, served)
            if usage is not None and usage.completion_tokens > 1:
                per_token = (now - self._first_chunk_at) / (usage.completion_tokens - 1)
                instruments.server_time_per_output_token.record(per_token, served)
        if usage is not None:
            token_type = semconv.GEN_AI_TOKEN_TYPE
            instruments.token_usage.record(
                usage.prompt_tokens, {**attributes, token_type: semconv.GEN_AI_TOKEN_TYPE_INPUT}
            )
            instruments.token_usage.record(
                usage.completion_tokens, {**attributes, token_type: semconv.GEN_AI_TOKEN_TYPE_OUTPUT}
            )
