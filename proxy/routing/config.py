"""Settings of the worker pool: the workers, the routing policy and the resilience knobs.

`RoutingSettings` is `[routing]` in radixgate.toml (and `RADIXGATE_ROUTING__*`, `--policy NAME`); a
`WorkerSpec` is one `[[workers]]` entry, a `--worker KIND=URL` or a `POST /admin/workers` body. Both
are the one model of their section: the settings tree (`proxy.settings`) and the pool read them as is.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec

from proxy.routing.launch import SGLangLaunchSettings

WorkerKind = Literal["sglang", "vllm", "openai", "local"]
PolicyName = Literal["cache_aware", "round_robin", "random", "power_of_two", "least_load", "session"]

POLICY_NAMES: tuple[PolicyName, ...] = (
    "cache_aware",
    "round_robin",
    "random",
    "power_of_two",
    "least_load",
    "session",
)
WORKER_KINDS: tuple[WorkerKind, ...] = ("sglang", "vllm", "openai", "local")

DEFAULT_POLICY: PolicyName = "cache_aware"
DEFAULT_WEIGHT = 1.0
DEFAULT_CAPACITY_TOKENS = 262_144
"""KV capacity assumed for a worker whose engine does not report one (tokens)."""
DEFAULT_EXPECTED_OUTPUT_TOKENS = 256
"""Output length assumed for a request without `max_tokens` when estimating queued work."""

DEFAULT_MATCH_THRESHOLD = 0.1
DEFAULT_DECODE_WEIGHT = 0.25
DEFAULT_PREFILL_HOLD_S = 0.0
DEFAULT_PREFILL_TOKENS_PER_S = 20_000.0
DEFAULT_TTFT_SLACK_S = math.inf
DEFAULT_LOAD_EPSILON = 1.0
DEFAULT_TREE_TTL_S = 600.0
DEFAULT_EVICT_HEADROOM = 0.1

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_BACKOFF_BASE_S = 0.05
DEFAULT_BACKOFF_MAX_S = 1.0

DEFAULT_HEALTH_INTERVAL_S = 5.0
DEFAULT_HEALTH_FAILURE_THRESHOLD = 2
DEFAULT_HEALTH_SUCCESS_THRESHOLD = 1

DEFAULT_BREAKER_FAILURE_THRESHOLD = 3
DEFAULT_BREAKER_COOLDOWN_S = 5.0
DEFAULT_BREAKER_MAX_COOLDOWN_S = 60.0

DEFAULT_DRAIN_TIMEOUT_S = 300.0


PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]
_PORT = r"([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_HOST_PORT = rf"[A-Za-z0-9._~-]+(:{_PORT})?"
_URL_REST = r"[^\x00-\x20\x7f]*"
"""A URL's path and query: no ASCII space or control character. Spelled out, not `\\S`: Python's `\\s`
counts `\\x1c`-`\\x1f` as spaces and JSON Schema's (ECMA-262) does not, so the API's schema would
admit URLs the gateway refuses."""
REMOTE_URL_PATTERN = rf"^https?://{_HOST_PORT}(/{_URL_REST})?$"
"""An http(s) URL whose host is a DNS name or an IPv4 address (name an IPv6 worker by a DNS name),
with an optional port."""
WORKER_URL_PATTERN = rf"^({REMOTE_URL_PATTERN[1:-1]}|local://{_URL_REST})$"
"""An http(s) URL with a host, or `local://...` for the embedded engine."""
WorkerUrl = Annotated[str, msgspec.Meta(pattern=WORKER_URL_PATTERN)]
API_KEY_PATTERN = r"^[\x21-\x7e]+$"
"""What an HTTP header can carry as a bearer token."""


DEFAULT_KV_EVENTS_STALE_S = 5.0
MAX_DATA_PARALLEL_RANKS = 256
"""Most data-parallel ranks one worker's events are followed on (one socket pair each)."""
DataParallelRank = Annotated[int, msgspec.Meta(ge=0, le=65_535)]
ZMQ_ENDPOINT_PATTERN = r"^(tcp://[A-Za-z0-9._~*\[\]:-]+:[0-9]{1,5}|ipc://[\x21-\x7e]+)$"
"""A ZMQ endpoint: `tcp://HOST:PORT` or `ipc://PATH` (printable ASCII)."""


class KvEventsSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Where a worker's engine publishes its KV-cache events (vLLM `--kv-events-config`, SGLang
    `--kv-events-config`): routing then follows the blocks the engine really holds."""

    endpoint: Annotated[str, msgspec.Meta(pattern=ZMQ_ENDPOINT_PATTERN)]
    """The engine's ZMQ PUB socket, connected to (`tcp://10.0.0.5:5557`)."""
    replay_endpoint: Annotated[str, msgspec.Meta(pattern=ZMQ_ENDPOINT_PATTERN)] | None = None
    """Its ROUTER socket that replays missed batches (`tcp://10.0.0.5:5558`); None: a gap resets
    the index instead."""
    topic: str = ""
    """The topic the engine publishes under ("" for vLLM's default)."""
    data_parallel_ranks: Annotated[
        frozenset[DataParallelRank], msgspec.Meta(min_length=1, max_length=MAX_DATA_PARALLEL_RANKS)
    ] = frozenset({0})
    """The engine's data-parallel ranks behind this worker (vLLM `--data-parallel-size 2`, SGLang
    `--dp-size 2 --enable-dp-attention`: `[0, 1]`). Rank r publishes on `endpoint`'s port plus r and
    replays on `replay_endpoint`'s plus r; every rank's blocks count for this worker."""
    stale_after_s: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_KV_EVENTS_STALE_S
    """A request dispatched this long ago with no event since means the events stopped: the
    worker's approximate tree routes until they resume."""


class WorkerSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One engine worker behind the gateway."""

    url: WorkerUrl
    """Base URL, with or without the trailing `/v1` (`http://10.0.0.5:8000`); ignored for `local`."""
    kind: WorkerKind = "openai"
    """Wire protocol: `sglang`, `vllm`, `openai` (any OpenAI-compatible server) or `local` (embedded)."""
    id: str | None = None
    """Stable name in metrics, `/health` and the admin API; defaults to `KIND@HOST:PORT`."""
    models: list[str] = msgspec.field(default_factory=list)
    """Models this worker serves; empty means ask the worker (`GET /v1/models`)."""
    weight: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_WEIGHT
    """Relative capacity: a worker of weight 2 is given twice the load before it looks as busy."""
    max_concurrency: PositiveInt | None = None
    """In-flight requests above which the worker is skipped; None means no local limit."""
    capacity_tokens: PositiveInt | None = None
    """KV capacity in tokens that sizes its routing tree; None asks the engine (SGLang, vLLM) or
    uses the default."""
    api_key: Annotated[str, msgspec.Meta(pattern=API_KEY_PATTERN)] | None = None
    """Bearer token radixgate sends to this worker (never the client's key); printable ASCII."""
    responses_api: bool | None = None
    """The worker serves `POST /v1/responses` itself, so Responses requests are passed through to it
    (when every worker of the model does); None asks the worker once, at start; the embedded engine
    never does (docs/responses.md)."""
    kv_events: KvEventsSpec | None = None
    """The engine's KV-event sockets, for exact prefix routing; None: the approximate tree only."""

    def __post_init__(self) -> None:
        if self.kind != "local" and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"worker url must start with http:// or https://, got {self.url!r}")


class CacheAwareSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Knobs of the `cache_aware` policy (see `proxy.routing.cache_aware` for the cost function)."""

    match_threshold: float = DEFAULT_MATCH_THRESHOLD
    """Below this best match ratio (matched / prompt tokens) the least-loaded worker is chosen."""
    decode_weight: float = DEFAULT_DECODE_WEIGHT
    """Queued work of one expected output token, relative to one prefill token. Small, because decode
    work is done somewhere whatever the choice: it only measures imbalance."""
    prefill_hold_s: Annotated[float, msgspec.Meta(ge=0)] = DEFAULT_PREFILL_HOLD_S
    """Seconds a dispatched request's uncached prompt counts as queued work; its expected output
    counts until the request ends. 0 (default): queued work is decode only, and the load bound keeps
    a burst of misses apart. A time in seconds is the engine's speed, not a property of routing: at
    1 s, a fast engine's long-done prefills kept making workers look busy and moved prefixes off the
    workers holding them (`benchmarks/routing`)."""
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    """Prefill speed of a weight-1 worker: how fast the prefill sent to a worker drains (a request
    that reuses nothing there waits behind it in the cost; the TTFT guard's queues). 20,000: an 8B
    model on one H100-class GPU (the simulated workers of `benchmarks/routing` at time scale 1)."""
    ttft_slack_s: float = DEFAULT_TTFT_SLACK_S
    """TTFT guard: a worker is a candidate only while its expected wait for this request's first token
    (the prefill queued there, then this request's uncached prefill) is at most this much longer than
    the fastest worker's. So a cached history is followed only while that costs the request little
    first-token delay. Off (`inf`) by default: on generated-shared-prefix at full cache, 0.1 s cost
    5 points of hit rate (the cold start's prefill queues move groups onto workers that then evict
    others); for latency-first chat with cache to spare, try 0.1."""
    load_epsilon: Annotated[float, msgspec.Meta(ge=0)] = DEFAULT_LOAD_EPSILON
    """Bounded-load affinity: a worker takes a request only while its in-flight requests (per unit
    of weight) stay below (1 + load_epsilon) times the mean, counting this request, so no worker
    exceeds that while another has room and a prefix hotter than one worker can serve spreads to a
    second worker, then a third, which warm it; and an idle worker takes the next request while
    another is above the mean. 1.0: at most twice the mean. Tighter bounds split groups of requests
    that share a prefix whenever their worker's share of the traffic rises by chance (at 16 in flight
    per worker, 0.25 moved 7% of them and cost 7.5 points of hit rate on generated-shared-prefix;
    `benchmarks/results/routing.md`)."""
    tree_ttl_s: float = DEFAULT_TREE_TTL_S
    """Tree entries untouched this long are dropped (engines evict idle prefixes too)."""
    expected_output_tokens: int = DEFAULT_EXPECTED_OUTPUT_TOKENS
    """Output length assumed when a request sets no `max_tokens`."""


class BreakerSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Circuit breaker per worker, fed by the outcome of real requests."""

    failure_threshold: int = DEFAULT_BREAKER_FAILURE_THRESHOLD
    """Consecutive failed requests that open the circuit."""
    cooldown_s: float = DEFAULT_BREAKER_COOLDOWN_S
    """Seconds the circuit stays open before one trial request is let through."""
    max_cooldown_s: float = DEFAULT_BREAKER_MAX_COOLDOWN_S
    """Cap of the cooldown, which doubles each time a trial request fails."""


class RoutingSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How a request finds a worker, and what happens when one fails."""

    policy: PolicyName = DEFAULT_POLICY
    """cache_aware (default), round_robin, random, power_of_two, least_load or session."""
    max_attempts: PositiveInt = DEFAULT_MAX_ATTEMPTS
    """Tries per request, each on a worker that has not failed it yet; only before the first byte."""
    backoff_base_s: Seconds = DEFAULT_BACKOFF_BASE_S
    """First retry waits up to this long; each later retry doubles it (full jitter)."""
    backoff_max_s: Seconds = DEFAULT_BACKOFF_MAX_S
    """Cap on one retry's wait."""
    tokenizers: dict[str, str] = msgspec.field(default_factory=dict)
    """Per model, what cache_aware tokenizes with: a tokenizer.json (or its directory), a .gguf file,
    or "engine" (the worker's /tokenize). Unlisted models are routed on UTF-8 bytes."""
    cache_aware: CacheAwareSettings = msgspec.field(default_factory=CacheAwareSettings)
    """Thresholds and weights of the cache_aware cost function."""
    breaker: BreakerSettings = msgspec.field(default_factory=BreakerSettings)
    """Circuit breaker per worker."""
    health_interval_s: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_HEALTH_INTERVAL_S
    """Seconds between two health checks of each worker (one check may take
    `upstream_client.health_timeout_s`)."""
    health_failure_threshold: PositiveInt = DEFAULT_HEALTH_FAILURE_THRESHOLD
    """Consecutive failed health checks that take a worker out of rotation."""
    health_success_threshold: PositiveInt = DEFAULT_HEALTH_SUCCESS_THRESHOLD
    """Consecutive good health checks that bring it back."""
    drain_timeout_s: Seconds = DEFAULT_DRAIN_TIMEOUT_S
    """Seconds a removed worker may finish its in-flight requests before it is closed anyway."""
    allowed_worker_hosts: list[str] | None = None
    """Hosts a worker added at run time (`POST /admin/workers`) may point at; None: the configured
    workers' hosts and loopback. So the admin API cannot send prompts anywhere else."""
    local_workers: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Embedded-engine worker processes to start on loopback ports and route over (`--workers N`)."""
    launch_sglang: SGLangLaunchSettings | None = None
    """SGLang servers to start and route over (`--launch-sglang PATH --replicas N`; GPU host)."""
    discover_kv_events: bool = True
    """Ask each worker without `kv_events` whether its engine publishes KV events (SGLang
    `/server_info`, vLLM's dev-mode `/server_info`) and follow them (`proxy.routing.kv_discovery`)."""


def parse_worker_arg(value: str) -> WorkerSpec:
    """`KIND=URL` from `--worker` (a bare URL means `openai`)."""
    kind, sep, url = value.partition("=")
    if not sep:
        kind, url = "openai", value
    if kind not in WORKER_KINDS:
        raise ValueError(f"--worker {value!r}: kind must be one of {', '.join(WORKER_KINDS)}")
    return WorkerSpec(kind=kind, url=url)
