"""`GET /v1/usage` (the caller's own tenant) and `GET /admin/usage` (every tenant; admin scope).

Figures are for the tenant's budget period (`auth.tenants.<id>.budget_period`), or since the ledger
began (`total`) for a tenant without a budget; see `proxy.ledger` for what is counted.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, get
from litestar.handlers import HTTPRouteHandler

from proxy.auth import Tenant, admin_guard, tenant_guard
from proxy.gateway import Gateway
from proxy.ledger import BudgetPeriod

USAGE_PATH = "/v1/usage"
ADMIN_USAGE_PATH = "/admin/usage"


class TenantUsage(msgspec.Struct, kw_only=True):
    """One tenant's usage in its budget period."""

    tenant: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_tokens: int
    budget: int | None
    """`token_budget`, null when the tenant has none."""
    budget_remaining: int | None
    period: BudgetPeriod


class UsageList(msgspec.Struct, kw_only=True):
    tenants: list[TenantUsage]


async def usage_of(gateway: Gateway, tenant: str) -> TenantUsage:
    """The ledger's figures for `tenant`; what is left of a budget as the limiter counts it (shared by
    every replica when the limits are in Redis)."""
    limits = gateway.limiter.limits(tenant)
    budget = limits.token_budget if limits is not None else None
    period: BudgetPeriod = limits.budget_period if limits is not None and budget is not None else "total"
    totals = gateway.ledger.totals(tenant, period)
    spent = await gateway.limiter.budget_used(tenant) if budget is not None else 0
    return TenantUsage(
        tenant=tenant,
        requests=totals.requests,
        prompt_tokens=totals.prompt_tokens,
        completion_tokens=totals.completion_tokens,
        cached_tokens=totals.cached_tokens,
        total_tokens=totals.total_tokens,
        budget=budget,
        budget_remaining=max(0, budget - spent) if budget is not None else None,
        period=period,
    )


def usage_handlers(gateway: Gateway) -> list[HTTPRouteHandler]:
    @get(USAGE_PATH, guards=[tenant_guard(gateway.auth)], name="usage")
    async def own_usage(request: Request[Any, Any, Any]) -> TenantUsage:
        tenant: Tenant = request.state.tenant  # set by the guard
        return await usage_of(gateway, tenant.id)

    @get(ADMIN_USAGE_PATH, guards=[admin_guard(gateway.auth)], name="admin_usage")
    async def every_usage() -> UsageList:
        auth = gateway.settings.auth
        tenants = sorted({*gateway.ledger.tenants(), *auth.tenants, *(key.tenant for key in auth.api_keys)})
        return UsageList(tenants=[await usage_of(gateway, tenant) for tenant in tenants])

    return [own_usage, every_usage]
