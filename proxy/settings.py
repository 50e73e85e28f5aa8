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
from proxy.http_protocol import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_HEADER_BYTES
from proxy.responses.config import ResponsesSettings
from proxy.routing.config import PositiveInt, RoutingSettings, Seconds, WorkerSpec
from proxy.telemetry.config import TelemetrySettings
from proxy.tenancy import TenantLimits

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_GRACEFUL_SHUTDOWN_S = 10.0
DEFAULT_ANONYMOUS_TENANT = "anonymous"

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
SHA256_HEX_PATTERN = r"^[0-9a-fA-F]{64}$"
Sha256Hex = Annotated[str, msgspec.Meta(pattern=SHA256_HEX_PATTERN)]
LogLevel = Literal["critical", "error", "warning", "info", "debug"]

DEFAULT_LOG_LEVEL: LogLevel = "info"


class ServerSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The HTTP listener (and the optional gRPC one beside it)."""

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
    header_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_HEADER_TIMEOUT_S
    """Seconds a request head may take to arrive, from its first byte (or the connection's start);
    then 408 and the connection is closed."""
    max_header_bytes: PositiveInt = DEFAULT_MAX_HEADER_BYTES
    """Largest request head (request line and header fields); a larger one is 431."""
    grpc_port: Port | None = None
    """Also serve the KServe v2 gRPC inference protocol on this port (same host; 0 picks a free one);
    None: no gRPC listener."""


DEFAULT_MAX_TOKENS_CAP = 4096
"""Completion tokens a request that sets no limit of its own may generate (an unbounded request kept
the embedded engine busy for over ten minutes)."""


class LimitsSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Bounds on what one request may ask for (the API's own bounds on `n`, messages and roles are
    always checked)."""

    default_max_tokens: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_MAX_TOKENS_CAP
    """`max_tokens` given to a request that sets neither it nor `max_completion_tokens`; 0: none, the
    engine's own default applies (for most, the rest of the context)."""
    max_tokens: PositiveInt | None = None
    """Largest `max_tokens` (or `max_completion_tokens`) accepted; above it a 400 names the field."""


class ApiKeySettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One accepted API key, stored as its SHA-256 (`radixgate config hash-key KEY`)."""

    tenant: str
    """Tenant id the key belongs to; it salts that tenant's cache keys."""
    sha256: Sha256Hex
    """Hex SHA-256 of the key."""
    admin: bool = False
    """True: the key may also administer the gateway (`/admin/*`, `POST /v1/cache/clear|warm`)."""


class AuthSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Who may call the gateway. No keys means every caller is one anonymous tenant."""

    api_keys: list[ApiKeySettings] = msgspec.field(default_factory=list)
    """Accepted keys; when any is set, requests without a valid `Authorization: Bearer` get 401.
    With none, every caller is the anonymous tenant and the admin API answers loopback clients only."""
    cache_salt_secret: str = ""
    """HMAC secret that turns a tenant id into its cache salt; set it to make salts unguessable."""
    anonymous_tenant: str = DEFAULT_ANONYMOUS_TENANT
    """Tenant id of callers when no keys are configured."""
    ledger_path: str | None = None
    """The usage ledger's SQLite file; default `usage.sqlite3` in `cache.dir`, else memory only."""
    tenants: dict[str, TenantLimits] = msgspec.field(default_factory=dict)
    """`[auth.tenants.<id>]`: per-tenant rate, token and concurrency limits and allowed models
    (`proxy.tenancy`); a tenant not listed is not limited."""


class Settings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The whole configuration."""

    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    workers: list[WorkerSpec] = msgspec.field(default_factory=list)
    """Upstream workers; none means the embedded engine (`local_engine`) serves every request."""
    routing: RoutingSettings = msgspec.field(default_factory=RoutingSettings)
    upstream_client: UpstreamClientConfig = msgspec.field(default_factory=UpstreamClientConfig)
    """Connection pool and timeouts toward the workers."""
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    limits: LimitsSettings = msgspec.field(default_factory=LimitsSettings)
    """Bounds on one request."""
    telemetry: TelemetrySettings = msgspec.field(default_factory=TelemetrySettings)
    local_engine: LocalEngineConfig = msgspec.field(default_factory=LocalEngineConfig)
    """The embedded engine, used when no `workers` are configured."""
    # The cache (`proxy.cache`): `[cache]`, and the seed's sections under their own names.
    cache: CacheSettings = msgspec.field(default_factory=CacheSettings)
    kv_cache: KvCacheSettings = msgspec.field(default_factory=KvCacheSettings)
    speculative: SpeculativeSettings = msgspec.field(default_factory=SpeculativeSettings)
    sliding_window: SlidingWindowSettings = msgspec.field(default_factory=SlidingWindowSettings)
    monitoring: MonitoringSettings = msgspec.field(default_factory=MonitoringSettings)
    responses: ResponsesSettings = msgspec.field(default_factory=ResponsesSettings)
    """`/v1/responses`: stored responses and their time to live."""


SECRET_KEYS = frozenset({"api_key", "cache_salt_secret"})
"""Keys whose values `radixgate config show` masks."""
