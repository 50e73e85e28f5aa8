"""Per-tenant limits shared by every gateway replica through Redis (`cache.redis_url`).

The same buckets as `proxy.tenancy`, kept in Redis and changed only by two Lua scripts, so a check
and its debit are one atomic step however many replicas ask at once: admitting a request is one
round trip, settling it one more (not waited for). The clock is Redis' own (`TIME`), so replicas'
clocks do not matter. Requests in flight are a sorted set per tenant whose entries expire after
`IN_FLIGHT_STALE_S`, so a replica that dies mid-request does not hold a slot for good. Budgets count
tokens per tenant and period in Redis (give Redis persistence for them to outlive its restarts).

When Redis cannot be reached, each replica enforces the limits on its own (`proxy.tenancy`) until it
can again, and says so in the log: a lost Redis never stops the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from adapters.schema import RequestParams
from proxy.ledger import period_key
from proxy.tenancy import (
    Admission,
    TenantLimiter,
    TenantLimits,
    check_budget,
    check_model,
    limited,
    rate_headers,
    reservation,
)

logger = logging.getLogger("radixgate.tenancy")

IN_FLIGHT_STALE_S = 600
"""A request in flight longer than this no longer holds its tenant's concurrency slot."""
DEFAULT_KEY_PREFIX = "radixgate:limits:"
_BUDGET_TTL_S = {"day": 2 * 86_400, "month": 40 * 86_400, "total": 0}

_LEVEL = """
local function level(key, cap, now)
  local h = redis.call('HMGET', key, 'level', 'ts')
  local lvl = tonumber(h[1]) or cap
  local ts = tonumber(h[2]) or now
  return math.min(cap, lvl + (now - ts) * cap / 60)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
"""
_ADMIT = (
    _LEVEL
    + """
local rpm, tpm, reserve = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local maxc, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
if budget > 0 then
  local used = tonumber(redis.call('GET', KEYS[4]) or '0')
  if used >= budget then return {'budget', tostring(used), '0'} end
end
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[7]))
  if redis.call('ZCARD', KEYS[3]) >= maxc then return {'concurrency', '1', '0'} end
end
local rl, tl = -1, -1
if rpm > 0 then
  rl = level(KEYS[1], rpm, now)
  if rl < 1 then return {'requests', tostring((1 - rl) * 60 / rpm), tostring(rl)} end
end
if tpm > 0 then
  tl = level(KEYS[2], tpm, now)
  local need = math.min(reserve, tpm)
  if tl < need then return {'tokens', tostring((need - tl) * 60 / tpm), tostring(tl)} end
end
if rpm > 0 then
  redis.call('HSET', KEYS[1], 'level', rl - 1, 'ts', now)
  redis.call('EXPIRE', KEYS[1], 120)
  rl = rl - 1
end
if tpm > 0 then
  redis.call('HSET', KEYS[2], 'level', tl - reserve, 'ts', now)
  redis.call('EXPIRE', KEYS[2], 120)
  tl = tl - reserve
end
if maxc > 0 then
  redis.call('ZADD', KEYS[3], now, ARGV[6])
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[7]))
end
return {'ok', tostring(rl), tostring(tl)}
"""
)
_SETTLE = (
    _LEVEL
    + """
local tpm, refund, spent = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if tpm > 0 and refund ~= 0 then
  local tl = level(KEYS[2], tpm, now)
  redis.call('HSET', KEYS[2], 'level', math.min(tpm, tl + refund), 'ts', now)
  redis.call('EXPIRE', KEYS[2], 120)
end
redis.call('ZREM', KEYS[3], ARGV[4])
if spent > 0 and KEYS[4] ~= '' then
  redis.call('INCRBY', KEYS[4], spent)
  if tonumber(ARGV[5]) > 0 then redis.call('EXPIRE', KEYS[4], tonumber(ARGV[5])) end
end
return 1
"""
)


class RedisLimiter:
    """`TenantLimiter`'s limits, shared through Redis; `local` serves while Redis is away."""

    def __init__(
        self,
        limits: dict[str, TenantLimits],
        url: str,
        local: TenantLimiter,
        prefix: str = DEFAULT_KEY_PREFIX,
    ) -> None:
        self._limits = limits
        self._local = local
        self._prefix = prefix
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=1.0, socket_connect_timeout=1.0
        )
        self._admit = self._redis.register_script(_ADMIT)
        self._settle = self._redis.register_script(_SETTLE)
        self._pending: set[asyncio.Task[Any]] = set()
        self._warned_at = 0.0

    def limits(self, tenant_id: str) -> TenantLimits | None:
        return self._limits.get(tenant_id)

    async def admit(self, tenant_id: str, params: RequestParams, body_bytes: int) -> Admission:
        limits = self._limits.get(tenant_id)
        if limits is None:
            return Admission(None, tenant_id, 0)
        check_model(limits, params)
        reserve = reservation(params, body_bytes)
        request_key = secrets.token_hex(8)
        try:
            verdict, first, second = await self._admit(
                keys=self._keys(tenant_id, limits),
                args=[
                    limits.requests_per_minute or 0,
                    limits.tokens_per_minute or 0,
                    reserve,
                    limits.max_concurrent_requests or 0,
                    limits.token_budget or 0,
                    request_key,
                    IN_FLIGHT_STALE_S,
                ],
            )
        except RedisError as exc:
            self._redis_away(exc)
            return self._local.admit_now(tenant_id, params, body_bytes)
        verdict = verdict.decode() if isinstance(verdict, bytes) else verdict
        if verdict == "budget":
            check_budget(limits, int(float(first)))
        if verdict == "concurrency":
            raise limited("Too many requests of this tenant are in flight at once.", 1.0, [])
        if verdict in ("requests", "tokens"):
            capacity = limits.requests_per_minute if verdict == "requests" else limits.tokens_per_minute
            raise limited(
                f"Rate limit reached for {verdict} per minute ({capacity}).",
                float(first),
                self._headers(limits, verdict, float(second)),
            )
        headers = self._headers(limits, "requests", float(first)) + self._headers(
            limits, "tokens", float(second)
        )
        return Admission(self, tenant_id, reserve, headers, request_key)

    def settle(self, admission: Admission, used_tokens: int | None) -> None:
        """Give back what was not used and free the slot, in the background (one more round trip)."""
        limits = self._limits[admission.tenant_id]
        spent = admission.reserved_tokens if used_tokens is None else used_tokens
        refund = 0 if used_tokens is None else admission.reserved_tokens - used_tokens
        task = asyncio.get_running_loop().create_task(
            self._settle(
                keys=self._keys(admission.tenant_id, limits),
                args=[
                    limits.tokens_per_minute or 0,
                    refund,
                    spent if limits.token_budget is not None else 0,
                    admission.request_key,
                    _BUDGET_TTL_S[limits.budget_period],
                ],
            )
        )
        self._pending.add(task)
        task.add_done_callback(self._settled)

    async def budget_used(self, tenant_id: str) -> int:
        limits = self._limits.get(tenant_id)
        if limits is None or limits.token_budget is None:
            return 0
        try:
            value = await self._redis.get(self._keys(tenant_id, limits)[3])
        except RedisError as exc:
            self._redis_away(exc)
            return await self._local.budget_used(tenant_id)
        return int(value or 0)

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self._redis.aclose()

    def _settled(self, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and isinstance(task.exception(), RedisError):
            self._redis_away(task.exception())

    def _keys(self, tenant_id: str, limits: TenantLimits) -> list[str]:
        base = f"{self._prefix}{tenant_id}:"
        budget = f"{base}budget:{period_key(limits.budget_period, time.time())}"
        return [base + "requests", base + "tokens", base + "in_flight", budget]

    @staticmethod
    def _headers(limits: TenantLimits, what: str, level: float) -> list[tuple[bytes, bytes]]:
        capacity = limits.requests_per_minute if what == "requests" else limits.tokens_per_minute
        return [] if capacity is None else rate_headers([(what.encode(), float(capacity), level)])

    def _redis_away(self, error: BaseException | None) -> None:
        now = time.monotonic()
        if now - self._warned_at > 30:
            self._warned_at = now
            logger.warning("tenant limits: Redis unreachable (%r); this replica enforces them alone", error)
