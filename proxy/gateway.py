"""What every route handler of one app shares."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from proxy.auth import Authenticator
from proxy.cache.step import ResponseCacheStep
from proxy.forwarding import Forwarder
from proxy.ledger import UsageLedger
from proxy.routing.pool import WorkerPool
from proxy.settings import Settings
from proxy.telemetry import Telemetry
from proxy.tenancy import Limiter, TenantLimiter


@dataclass(slots=True)
class Gateway:
    """The router, forwarder, authenticator and telemetry of one app, plus its live counters."""

    settings: Settings
    router: WorkerPool
    forwarder: Forwarder
    auth: Authenticator
    telemetry: Telemetry
    version: str
    started_at: float = field(default_factory=time.monotonic)
    active_requests: int = 0
    """Generation requests being served right now (`GET /health`)."""
    cache: ResponseCacheStep = field(default_factory=lambda: ResponseCacheStep(None))
    """The response-cache step of the request path (`proxy.cache`); the default caches nothing."""
    limiter: Limiter = field(default_factory=lambda: TenantLimiter({}))
    """Per-tenant limits (`proxy.tenancy`); the default limits nobody."""
    ledger: UsageLedger = field(default_factory=lambda: UsageLedger(None))
    """Usage per tenant (`proxy.ledger`); the default keeps it in memory."""
