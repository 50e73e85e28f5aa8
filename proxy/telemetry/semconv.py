"""Every OpenTelemetry semantic-convention name radixgate emits, in one place.

GenAI names follow the OpenTelemetry GenAI conventions (open-telemetry/semantic-conventions-genai,
`docs/gen-ai/gen-ai-spans.md` and `gen-ai-metrics.md`); HTTP and server names follow the stable
HTTP conventions. Other modules import names from here and never spell an attribute inline.
"""

from __future__ import annotations

from typing import Final

# ---- GenAI span attributes -------------------------------------------------

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
GEN_AI_REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_FREQUENCY_PENALTY: Final = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY: Final = "gen_ai.request.presence_penalty"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"

GEN_AI_TOKEN_TYPE_INPUT: Final = "input"
GEN_AI_TOKEN_TYPE_OUTPUT: Final = "output"

# ---- general attributes ----------------------------------------------------

SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"
ERROR_TYPE_OTHER: Final = "_OTHER"
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_ROUTE: Final = "http.route"
URL_PATH: Final = "url.path"
URL_SCHEME: Final = "url.scheme"
USER_AGENT_ORIGINAL: Final = "user_agent.original"
NETWORK_PROTOCOL_VERSION: Final = "network.protocol.version"
CLIENT_ADDRESS: Final = "client.address"
SERVICE_NAME: Final = "service.name"
SERVICE_VERSION: Final = "service.version"
RPC_SYSTEM: Final = "rpc.system"
RPC_SYSTEM_GRPC: Final = "grpc"
RPC_SERVICE: Final = "rpc.service"
RPC_METHOD: Final = "rpc.method"
RPC_GRPC_STATUS_CODE: Final = "rpc.grpc.status_code"

# ---- GenAI client metrics --------------------------------------------------

GEN_AI_CLIENT_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
GEN_AI_CLIENT_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK: Final = "gen_ai.client.operation.time_per_output_chunk"

# ---- GenAI server metrics (the gateway is the GenAI server its clients talk to) ----

GEN_AI_SERVER_REQUEST_DURATION: Final = "gen_ai.server.request.duration"
GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: Final = "gen_ai.server.time_to_first_token"
GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN: Final = "gen_ai.server.time_per_output_token"
UNIT_SECONDS: Final = "s"
UNIT_TOKENS: Final = "{token}"

# The conventions' ExplicitBucketBoundaries advice for each histogram.
DURATION_BUCKETS: Final = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
TIME_TO_FIRST_CHUNK_BUCKETS: Final = DURATION_BUCKETS
SERVER_TIME_TO_FIRST_TOKEN_BUCKETS: Final = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
TIME_PER_OUTPUT_TOKEN_BUCKETS: Final = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
TIME_PER_OUTPUT_CHUNK_BUCKETS: Final = TIME_PER_OUTPUT_TOKEN_BUCKETS
TOKEN_USAGE_BUCKETS: Final = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)

# ---- radixgate's own instrumentation scope --------------------------------

INSTRUMENTATION_SCOPE: Final = "radixgate"


def client_span_name(operation: str, model: str) -> str:
    """`{gen_ai.operation.name} {gen_ai.request.model}`, the GenAI client span name."""
    return f"{operation} {model}"


def rpc_span_name(service: str, method: str) -> str:
    """`{rpc.service}/{rpc.method}`, the RPC span name."""
    return f"{service}/{method}"


def server_span_name(method: str, route: str | None) -> str:
    """`{method} {http.route}`, or the method alone when no route matched (HTTP span convention)."""
    return f"{method} {route}" if route else method


# ---- routing (radixgate's own names; no OTel convention covers worker selection) ----

ROUTING_SPAN_NAME: Final = "radixgate.route"
"""INTERNAL span of one routing decision and its outcome (one per attempt): it starts at the
decision and ends when the attempt's lease is released, with the engine's `cached_tokens`."""
ROUTING_POLICY: Final = "radixgate.routing.policy"
ROUTING_WORKER_ID: Final = "radixgate.routing.worker.id"
ROUTING_REASON: Final = "radixgate.routing.reason"
ROUTING_PROMPT_TOKENS: Final = "radixgate.routing.prompt_tokens"
ROUTING_MATCH_TOKENS: Final = "radixgate.routing.match_tokens"
ROUTING_CANDIDATES: Final = "radixgate.routing.candidates"
ROUTING_EXCLUDED: Final = "radixgate.routing.excluded"
ROUTING_WORKER_LOADS: Final = "radixgate.routing.worker_loads"
"""`id=queued_work` per candidate, comma separated."""
ROUTING_TOKENIZER: Final = "radixgate.routing.tokenizer"
ROUTING_MATCH_SOURCE: Final = "radixgate.routing.match_source"
""""tree" (the approximate prefix tree) or "events" (the engine's KV events)."""
ROUTING_CACHED_TOKENS: Final = "radixgate.routing.cached_tokens"
"""Prompt tokens the engine reported cached (`usage.prompt_tokens_details.cached_tokens`)."""
ROUTING_PREDICTION_ERROR: Final = "radixgate.routing.prediction_error_tokens"
"""Predicted match minus the engine's cached tokens (positive: the tree over-predicted)."""
ROUTING_OUTCOME: Final = "radixgate.routing.outcome"
""""ok" or "failed"."""

# Prometheus series of the router (MetricsRegistry adds the `radixgate_` prefix).
ROUTING_DECISIONS_METRIC: Final = "routing_decisions_total"
ROUTING_MATCH_TOKENS_METRIC: Final = "routing_match_tokens_total"
ROUTING_PROMPT_TOKENS_METRIC: Final = "routing_prompt_tokens_total"
ROUTING_FAILURES_METRIC: Final = "routing_worker_failures_total"
ROUTING_NO_WORKER_METRIC: Final = "routing_no_worker_total"
ROUTING_PREDICTION_ERROR_METRIC: Final = "routing_prediction_error_tokens"
ROUTING_PREDICTED_CACHED_METRIC: Final = "routing_predicted_cached_tokens_total"
ROUTING_REPORTED_CACHED_METRIC: Final = "routing_reported_cached_tokens_total"
ROUTING_PANIC_METRIC: Final = "routing_panic_requests_total"
ROUTING_MODEL_PANIC_METRIC: Final = "routing_model_panic"
ROUTING_DECISION_SECONDS_METRIC: Final = "routing_decision_seconds"
ROUTING_WORKER_IN_FLIGHT_METRIC: Final = "routing_worker_in_flight"
ROUTING_WORKER_QUEUED_WORK_METRIC: Final = "routing_worker_queued_work_tokens"
ROUTING_WORKER_TREE_TOKENS_METRIC: Final = "routing_worker_tree_tokens"
ROUTING_WORKER_UP_METRIC: Final = "routing_worker_up"
ROUTING_WORKER_BREAKER_OPEN_METRIC: Final = "routing_worker_breaker_open"
ROUTING_MODEL_HEALTHY_WORKERS_METRIC: Final = "routing_model_healthy_workers"

# ---- response cache (radixgate's own names) ----

RESPONSE_CACHE_SPAN_NAME: Final = "radixgate.response_cache"
"""INTERNAL span of one response-cache lookup; on a hit it also covers the replay."""
RESPONSE_CACHE_HIT: Final = "radixgate.response_cache.hit"
"""True when the stored answer was replayed and no engine was called."""
RESPONSE_CACHE_OUTCOME: Final = "radixgate.response_cache.outcome"
"""`hit`, `miss` or `refresh` (`Cache-Control: no-cache`: no lookup, the answer is stored)."""
RESPONSE_CACHE_LOOKUP_SECONDS: Final = "radixgate.response_cache.lookup_seconds"
