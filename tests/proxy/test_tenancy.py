"""Per-tenant limits on a fake clock: request and token buckets, refunds, concurrency, allowed models."""

from __future__ import annotations

import pytest

from adapters.schema import CompletionRequest
from proxy.errors import ApiError
from proxy.tenancy import BYTES_PER_TOKEN, TenantLimiter, TenantLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def params(max_tokens: int | None = 10, model: str = "m") -> CompletionRequest:
    return CompletionRequest(model=model, prompt="x", max_tokens=max_tokens)


def refused(limiter: TenantLimiter, **kwargs: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        limiter.admit_now("acme", params(**kwargs), 0)  # type: ignore[arg-type]
    return caught.value


def test_requests_per_minute_refill_continuously() -> None:
    clock = Clock()
    limiter = TenantLimiter({"acme": TenantLimits(requests_per_minute=3)}, clock=clock)
    for _ in range(3):
        limiter.admit_now("acme", params(), 0).settle(0)
    error = refused(limiter)
    assert (error.status, error.detail.code) == (429, "rate_limit_exceeded")
    assert error.headers is not None and error.headers["retry-after"] == "20"  # one request per 20 s
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    clock.now += 20
    admitted = limiter.admit_now("acme", params(), 0)
    assert dict(admitted.headers)[b"x-ratelimit-limit-requests"] == b"3"
    assert limiter.admit_now("other", params(), 0).headers == []  # a tenant without limits


def test_tokens_are_reserved_up_front_and_refunded_from_the_usage() -> None:
    clock = Clock()
    limiter = TenantLimiter({"acme": TenantLimits(tokens_per_minute=100)}, clock=clock)
    body = 40 * BYTES_PER_TOKEN  # a prompt estimated at 40 tokens
    first = limiter.admit_now("acme", params(max_tokens=50), body)  # reserves 90 of 100
    assert first.reserved_tokens == 90
    with pytest.raises(ApiError):
        limiter.admit_now("acme", params(max_tokens=50), body)
    first.settle(used_tokens=10)  # 80 of the reservation come back: 90 free again
    second = limiter.admit_now("acme", params(max_tokens=50), body)
    assert dict(second.headers)[b"x-ratelimit-remaining-tokens"] == b"0"
    second.settle(used_tokens=None)  # usage unknown: the reservation stands
    assert refused(limiter, max_tokens=50).status == 429


def test_concurrent_requests_are_bounded_and_freed_on_settle() -> None:
    limiter = TenantLimiter({"acme": TenantLimits(max_concurrent_requests=2)}, clock=Clock())
    held = [limiter.admit_now("acme", params(), 0) for _ in range(2)]
    assert refused(limiter).status == 429
    held[0].settle(0)
    held[0].settle(0)  # settling twice frees one slot only
    limiter.admit_now("acme", params(), 0)
    assert refused(limiter).status == 429


def test_models_outside_the_allow_list_do_not_exist_for_the_tenant() -> None:
    limiter = TenantLimiter({"acme": TenantLimits(models=["m"])}, clock=Clock())
    limiter.admit_now("acme", params(model="m"), 0)
    error = refused(limiter, model="other")
    assert (error.status, error.detail.code) == (404, "model_not_found")
