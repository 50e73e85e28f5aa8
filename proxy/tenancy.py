"""Per-tenant limits: requests and tokens per minute, concurrent requests, and the models a tenant may use.

    [auth.tenants.acme]
    requests_per_minute = 600
    tokens_per_minute = 200000
    max_concurrent_requests = 16
    models = ["llama-3-8b"]          # empty: every model
    token_budget = 5000000           # per budget_period (day, month, total), from the usage ledger

`TenantLimiter.admit` is the pipeline's admission step: it takes one request and the request's
token reservation (its prompt, estimated at one token per `BYTES_PER_TOKEN` bytes of body, plus its
`max_tokens`) from the tenant's token buckets, or refuses with 429 `rate_limit_exceeded` and a
`Retry-After`. `Admission.settle` gives back what the engine's usage says was not used (a cache hit
uses none) and frees the concurrency slot. Every answer to a limited tenant carries OpenAI's
`x-ratelimit-*` headers, so the openai SDK's own backoff works.

A bucket refills continuously at its per-minute rate and holds at most one minute's worth. It is
written here rather than taken from the `limits` package because settling a reservation needs a
refund, which `limits`' strategies do not offer. The buckets here live in this process; with Redis
configured (`cache.redis_url`) `proxy.tenancy_redis` keeps the same buckets in Redis, so N replicas
enforce one limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Protocol

import msgspec

from adapters.schema import RequestParams
from proxy.errors import ApiError
from proxy.ledger import BudgetPeriod, UsageLedger

BYTES_PER_TOKEN = 4
"""The prompt's token count, estimated from its body for the reservation (settled from usage later)."""
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Headers = list[tuple[bytes, bytes]]


class TenantLimits(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """`[auth.tenants.<id>]`: what one tenant may use; an unset limit does not apply."""

    requests_per_minute: PositiveInt | None = None
    """Generation requests per minute; more get 429 `rate_limit_exceeded`."""
    tokens_per_minute: PositiveInt | None = None
    """Prompt plus completion tokens per minute, reserved up front and settled from the usage."""
    max_concurrent_requests: PositiveInt | None = None
    """Generation requests in flight at once; one more gets 429 at once."""
    token_budget: PositiveInt | None = None
    """Tokens the tenant may use per `budget_period` (read from the usage ledger); once spent, 429
    `insufficient_quota`."""
    budget_period: BudgetPeriod = "month"
    """`day`, `month` (UTC) or `total`."""
    models: list[str] = msgspec.field(default_factory=list)
    """The models the tenant may use; empty: every model. Others are 404 `model_not_found`."""


@dataclass(slots=True)
class TokenBucket:
    """`capacity` units that refill at `capacity` per minute."""

    capacity: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.capacity / 60.0)
        self.updated = now

    def seconds_until(self, amount: float) -> float:
        """How long until `amount` is available (0 when it is now)."""
        return max(0.0, (min(amount, self.capacity) - self.level) * 60.0 / self.capacity)


@dataclass(slots=True)
class _TenantState:
    requests: TokenBucket | None
    tokens: TokenBucket | None
    in_flight: int = 0


class Settles(Protocol):
    def settle(self, admission: Admission, used_tokens: int | None) -> None: ...


class Limiter(Protocol):
    """What the pipeline asks of a tenant limiter (this module's, or `proxy.tenancy_redis`'s)."""

    def limits(self, tenant_id: str) -> TenantLimits | None: ...

    async def admit(self, tenant_id: str, params: RequestParams, body_bytes: int) -> Admission: ...

    async def budget_used(self, tenant_id: str) -> int: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class Admission:
    """One admitted request's hold on its tenant's limits; `settle` exactly once."""

    limiter: Settles | None
    tenant_id: str
    reserved_tokens: int
    headers: Headers = field(default_factory=list)
    """The `x-ratelimit-*` headers for the answer."""
    request_key: str = ""
    """Names this request among the tenant's in flight (the shared limiter's)."""

    def settle(self, used_tokens: int | None) -> None:
        """Free the concurrency slot and refund the tokens not used (`None`: keep the reservation)."""
        if self.limiter is not None:
            self.limiter.settle(self, used_tokens)
            self.limiter = None


class TenantLimiter:
    """The limits of every configured tenant, enforced in this process."""

    __slots__ = ("_clock", "_ledger", "_limits", "_states")

    def __init__(
        self,
        limits: dict[str, TenantLimits],
        ledger: UsageLedger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = limits
        self._ledger = ledger
        """Where budgets read what a tenant used (budgets need one)."""
        self._clock = clock
        self._states: dict[str, _TenantState] = {}

    def limits(self, tenant_id: str) -> TenantLimits | None:
        return self._limits.get(tenant_id)

    async def admit(self, tenant_id: str, params: RequestParams, body_bytes: int) -> Admission:
        """Take one request and its tokens from the tenant's limits, or raise the 404/429 to answer."""
        return self.admit_now(tenant_id, params, body_bytes)

    async def aclose(self) -> None:
        """Nothing to close: the buckets live in this process."""

    async def budget_used(self, tenant_id: str) -> int:
        """Tokens the tenant used in its current budget period (0 without a budget)."""
        limits = self._limits.get(tenant_id)
        if limits is None or limits.token_budget is None or self._ledger is None:
            return 0
        return self._ledger.totals(tenant_id, limits.budget_period).total_tokens

    def admit_now(self, tenant_id: str, params: RequestParams, body_bytes: int) -> Admission:
        """`admit`, without waiting on anything (the in-process limits)."""
        limits = self._limits.get(tenant_id)
        if limits is None:
            return Admission(None, tenant_id, 0)
        check_model(limits, params)
        if limits.token_budget is not None and self._ledger is not None:
            used = self._ledger.totals(tenant_id, limits.budget_period).total_tokens
            check_budget(limits, used)
        state = self._state(tenant_id, limits)
        now = self._clock()
        reserve = reservation(params, body_bytes)
        if limits.max_concurrent_requests is not None and state.in_flight >= limits.max_concurrent_requests:
            raise _limited(
                f"You have {state.in_flight} requests in flight, the most this tenant may have at once.",
                1.0,
                self._headers(state, now),
            )
        for bucket, amount, what in ((state.requests, 1, "requests"), (state.tokens, reserve, "tokens")):
            if bucket is None:
                continue
            bucket.refill(now)
            if bucket.level < min(amount, bucket.capacity):
                wait = bucket.seconds_until(amount)
                raise _limited(
                    f"Rate limit reached for {what} per minute ({int(bucket.capacity)}); "
                    f"retry in {wait:.1f}s.",
                    wait,
                    self._headers(state, now),
                )
        if state.requests is not None:
            state.requests.level -= 1
        if state.tokens is not None:
            state.tokens.level -= reserve
        state.in_flight += 1
        return Admission(self, tenant_id, reserve, self._headers(state, now))

    def settle(self, admission: Admission, used_tokens: int | None) -> None:
        state = self._states[admission.tenant_id]
        state.in_flight -= 1
        if state.tokens is not None and used_tokens is not None:
            refund = admission.reserved_tokens - used_tokens
            state.tokens.level = min(state.tokens.capacity, state.tokens.level + refund)

    def _state(self, tenant_id: str, limits: TenantLimits) -> _TenantState:
        state = self._states.get(tenant_id)
        if state is None:
            now = self._clock()
            state = self._states[tenant_id] = _TenantState(
                _bucket(limits.requests_per_minute, now), _bucket(limits.tokens_per_minute, now)
            )
        return state

    @staticmethod
    def _headers(state: _TenantState, now: float) -> Headers:
        levels = []
        for bucket, what in ((state.requests, b"requests"), (state.tokens, b"tokens")):
            if bucket is not None:
                bucket.refill(now)
                levels.append((what, bucket.capacity, bucket.level))
        return rate_headers(levels)


def reservation(params: RequestParams, body_bytes: int) -> int:
    """Tokens a request reserves: its prompt, estimated from the body, and its most output."""
    return body_bytes // BYTES_PER_TOKEN + (params.token_limit or 0) * params.n


def check_model(limits: TenantLimits, params: RequestParams) -> None:
    if limits.models and params.model not in limits.models:
        raise ApiError.model_not_found(params.model)


def check_budget(limits: TenantLimits, used: int) -> None:
    if limits.token_budget is not None and used >= limits.token_budget:
        raise ApiError(
            429,
            f"You used {used} of your {limits.token_budget} tokens this {limits.budget_period} "
            "budget period.",
            error_type="insufficient_quota",
            code="insufficient_quota",
        )


def rate_headers(levels: list[tuple[bytes, float, float]]) -> Headers:
    """OpenAI's `x-ratelimit-*` headers for (what, capacity, level) of each bucket."""
    headers: Headers = []
    for what, capacity, level in levels:
        reset = max(0.0, (capacity - level) * 60.0 / capacity)
        headers += [
            (b"x-ratelimit-limit-" + what, str(int(capacity)).encode()),
            (b"x-ratelimit-remaining-" + what, str(max(0, math.floor(level))).encode()),
            (b"x-ratelimit-reset-" + what, f"{reset:.3f}s".encode()),
        ]
    return headers


def limited(message: str, retry_after_s: float, headers: Headers) -> ApiError:
    """The 429 `rate_limit_exceeded` to answer, with `Retry-After` and the rate headers."""
    return _limited(message, retry_after_s, headers)


def _bucket(per_minute: int | None, now: float) -> TokenBucket | None:
    return None if per_minute is None else TokenBucket(float(per_minute), float(per_minute), now)


def _limited(message: str, retry_after_s: float, headers: Headers) -> ApiError:
    response_headers = {name.decode(): value.decode() for name, value in headers}
    response_headers["retry-after"] = str(max(1, math.ceil(retry_after_s)))
    return ApiError(429, message, error_type="requests", code="rate_limit_exceeded", headers=response_headers)
