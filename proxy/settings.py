"""The one typed settings tree of the gateway. Every section forbids unknown keys, so a misspelled
key is an error rather than a silently ignored line.

Sources, later ones winning: `radixgate.toml` (or `--config FILE`), then `RADIXGATE_*` environment
variables (`RADIXGATE_SERVER__PORT=9000` sets `server.port`; `__` separates levels), then CLI flags.
`proxy.config` loads and validates them; docs/configuration.md lists every key.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from adapters.local.config import LocalEngineConfig
from adapters.openai_compat import UpstreamClientConfig
from proxy.cache.settings import (
    CacheSettings,
    KvCacheSettings,
    MonitoringSettings,
    SlidingWindowSettings,
    SpeculativeSettings,
)
from proxy.routing.config import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_HEALTH_FAILURE_THRESHOLD,
    DEFAULT_HEALTH_SUCCESS_THRESHOLD,
    DEFAULT_POLICY,
    BreakerSettings,
    CacheAwareSettings,
    PolicyName,
)
from proxy.routing.launch import SGLangLaunchSettings
from proxy.telemetry.config import TelemetrySettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_GRACEFUL_SHUTDOWN_S = 10.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_BACKOFF_BASE_S = 0.05
DEFAULT_BACKOFF_MAX_S = 1.0
DEFAULT_HEALTH_INTERVAL_S = 5.0
DEFAULT_ANONYMOUS_TENANT = "anonymous"

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]
HTTP_URL_PATTERN = r"^https?://[^/\s]+"
SHA256_HEX_PATTERN = r"^[0-9a-fA-F]{64}$"
HttpUrl = Annotated[str, msgspec.Meta(pattern=HTTP_URL_PATTERN)]
Sha256Hex = Annotated[str, msgspec.Meta(pattern=SHA256_HEX_PATTERN)]
LogLevel = Literal["critical", "error", "warning", "info", "debug"]
WorkerKind = Literal["openai", "vllm", "sglang"]

DEFAULT_LOG_LEVEL: LogLevel = "info"


class ServerSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The HTTP listener."""

    host: str = DEFAULT_HOST
    """Address to bind; `0.0.0.0` to accept connections from other machines."""
    port: Port = DEFAULT_PORT
    """TCP port to listen on (0 picks a free one)."""
    max_body_bytes: PositiveInt = DEFAULT_MAX_BODY_BYTES
    """Largest request body accepted; larger ones get 413."""
    log_level: LogLevel = DEFAULT_LOG_LEVEL
    """Log level of the gateway and the ASGI server."""
    access_log: bool = False
    """One log line per request (costs CPU on the hot path; off by default)."""
    graceful_shutdown_s: Seconds = DEFAULT_GRACEFUL_SHUTDOWN_S
    """On shutdown, seconds in-flight requests get to finish."""


class WorkerSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One upstream engine server speaking the OpenAI API."""

    url: HttpUrl
    """Base URL, with or without the trailing `/v1` (`http://10.0.0.5:8000`)."""
    models: list[str] = msgspec.field(default_factory=list)
    """Model ids served by this worker; empty means ask the worker (`GET /v1/models`)."""
    kind: WorkerKind = "openai"
    """The engine behind the URL; names the provider in traces."""
    id: str | None = None
    """Name in `/health` and logs; defaults to `host:port` of the URL."""
    api_key: str | None = None
    """Bearer token radixgate sends to this worker (never the client's key)."""
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    """Relative capacity for load-aware routing: weight 2 takes twice the load of weight 1."""
    max_concurrency: PositiveInt | None = None
    """In-flight requests above which the router skips this worker; None: no local limit."""
    capacity_tokens: PositiveInt | None = None
    """KV capacity in tokens that sizes this worker's routing tree; None: ask the engine."""


class RoutingSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How a request finds a worker, and what happens when one fails."""

    max_attempts: PositiveInt = DEFAULT_MAX_ATTEMPTS
    """Tries per request, each on a worker that has not failed it yet; only before the first byte."""
    backoff_base_s: Seconds = DEFAULT_BACKOFF_BASE_S
    """First retry waits up to this long; each later retry doubles it (full jitter)."""
    backoff_max_s: Seconds = DEFAULT_BACKOFF_MAX_S
    """Cap on one retry's wait."""
    health_interval_s: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_HEALTH_INTERVAL_S
    """Seconds between two health checks of each worker."""
    policy: PolicyName = DEFAULT_POLICY
    """cache_aware (default), round_robin, random, power_of_two, least_load or session."""
    tokenizers: dict[str, str] = msgspec.field(default_factory=dict)
    """Per model, what cache_aware tokenizes with: a tokenizer.json (or its directory), a .gguf file,
    or "engine" (the worker's /tokenize). Unlisted models are routed on UTF-8 bytes."""
    cache_aware: CacheAwareSettings = msgspec.field(default_factory=CacheAwareSettings)
    """Thresholds and weights of the cache_aware cost function."""
    breaker: BreakerSettings = msgspec.field(default_factory=BreakerSettings)
    """Circuit breaker per worker."""
    health_failure_threshold: PositiveInt = DEFAULT_HEALTH_FAILURE_THRESHOLD
    """Consecutive failed health checks that take a worker out of rotation."""
    health_success_threshold: PositiveInt = DEFAULT_HEALTH_SUCCESS_THRESHOLD
    """Consecutive good health checks that bring it back."""
    drain_timeout_s: Seconds = DEFAULT_DRAIN_TIMEOUT_S
    """Seconds a removed worker may finish its in-flight requests before it is closed anyway."""
    local_workers: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Embedded-engine worker processes to start on loopback ports and route over (`--workers N`)."""
    launch_sglang: SGLangLaunchSettings | None = None
    """SGLang servers to start and route over (`--launch-sglang PATH --replicas N`; GPU host)."""


class ApiKeySettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One accepted API key, stored as its SHA-256 (`radixgate config hash-key KEY`)."""

    tenant: str
    """Tenant id the key belongs to; it salts that tenant's cache keys."""
    sha256: Sha256Hex
    """Hex SHA-256 of the key."""


class AuthSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Who may call the gateway. No keys means every caller is one anonymous tenant."""

    api_keys: list[ApiKeySettings] = msgspec.field(default_factory=list)
    """Accepted keys; when any is set, requests without a valid `Authorization: Bearer` get 401."""
    cache_salt_secret: str = ""
    """HMAC secret that turns a tenant id into its cache salt; set it to make salts unguessable."""
    anonymous_tenant: str = DEFAULT_ANONYMOUS_TENANT
    """Tenant id of callers when no keys are configured."""


class Settings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The whole configuration."""

    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    workers: list[WorkerSettings] = msgspec.field(default_factory=list)
    """Upstream workers; none means the embedded engine (`local_engine`) serves every request."""
    routing: RoutingSettings = msgspec.field(default_factory=RoutingSettings)
    upstream_client: UpstreamClientConfig = msgspec.field(default_factory=UpstreamClientConfig)
    """Connection pool and timeouts toward the workers."""
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    telemetry: TelemetrySettings = msgspec.field(default_factory=TelemetrySettings)
    local_engine: LocalEngineConfig = msgspec.field(default_factory=LocalEngineConfig)
    """The embedded engine, used when no `workers` are configured."""
    # The cache (`proxy.cache`): `[cache]`, and the seed's sections under their own names.
    cache: CacheSettings = msgspec.field(default_factory=CacheSettings)
    kv_cache: KvCacheSettings = msgspec.field(default_factory=KvCacheSettings)
    speculative: SpeculativeSettings = msgspec.field(default_factory=SpeculativeSettings)
    sliding_window: SlidingWindowSettings = msgspec.field(default_factory=SlidingWindowSettings)
    monitoring: MonitoringSettings = msgspec.field(default_factory=MonitoringSettings)


SECRET_KEYS = frozenset({"api_key", "cache_salt_secret"})
"""Keys whose values `radixgate config show` masks."""
