"""The request path: retries before the first byte, leases released once, streams closed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from adapters.base import EngineRequest
from adapters.errors import (
    InBandError,
    UpstreamStatusError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from adapters.schema import ChatCompletionRequest, ChatMessage
from proxy.forwarding import Forwarder, RetryPolicy
from proxy.routing.pool import WorkerPool
from proxy.telemetry import Telemetry, TelemetrySettings
from tests.proxy.scripted_engine import BODY, CHUNKS, ScriptedEngine, scripted_pool


def _request() -> EngineRequest:
    params = ChatCompletionRequest(model="m", messages=[ChatMessage(role="user", content="hi")])
    return EngineRequest("chat", params, b"{}", "r", "t", "s")


@pytest.fixture
async def engines() -> AsyncIterator[list[ScriptedEngine]]:
    yield [ScriptedEngine("a"), ScriptedEngine("b")]


@pytest.fixture
async def router(engines: list[ScriptedEngine]) -> AsyncIterator[WorkerPool]:
    router = scripted_pool(engines)
    await router.start()
    yield router
    await router.aclose()


def _forwarder(router: WorkerPool, attempts: int = 3) -> Forwarder:
    telemetry = Telemetry.from_settings(TelemetrySettings(enabled=False), service_version="test")
    return Forwarder(router, telemetry, RetryPolicy(attempts, 0.001, 0.002))


def _in_flight(router: WorkerPool) -> list[int]:
    return [worker.in_flight for worker in router.workers()]


async def test_retryable_error_moves_to_the_other_worker(
    router: WorkerPool, engines: list[ScriptedEngine]
) -> None:
    engines[0].script.append(UpstreamUnreachable("down"))
    completion = await _forwarder(router).complete(_request())
    assert completion.body == BODY
    assert [len(engine.calls) for engine in engines] == [1, 1]
    assert _in_flight(router) == [0, 0]


async def test_client_errors_are_not_retried(router: WorkerPool, engines: list[ScriptedEngine]) -> None:
    engines[0].script.append(UpstreamStatusError(400, "bad"))
    with pytest.raises(UpstreamStatusError):
        await _forwarder(router).complete(_request())
    assert [len(engine.calls) for engine in engines] == [1, 0]


async def test_when_every_worker_failed_the_last_error_is_raised(
    router: WorkerPool, engines: list[ScriptedEngine]
) -> None:
    engines[0].script.append(UpstreamTimeout("slow"))
    engines[1].script.append(UpstreamStatusError(503, "busy"))
    with pytest.raises(UpstreamStatusError, match="busy"):
        await _forwarder(router).complete(_request())
    assert _in_flight(router) == [0, 0]


async def test_attempts_are_capped(router: WorkerPool, engines: list[ScriptedEngine]) -> None:
    engines[0].script.append(UpstreamTimeout("slow"))
    with pytest.raises(UpstreamTimeout):
        await _forwarder(router, attempts=1).complete(_request())
    assert [len(engine.calls) for engine in engines] == [1, 0]


async def test_stream_retries_before_the_first_chunk(
    router: WorkerPool, engines: list[ScriptedEngine]
) -> None:
    engines[0].script.append(UpstreamStatusError(429, "slow down"))
    stream = await _forwarder(router).open_stream(_request())
    assert stream.first == CHUNKS[0]
    assert [chunk async for chunk in stream] == CHUNKS[1:]
    await stream.close()
    assert [engine.closed_streams for engine in engines] == [1, 1]
    assert _in_flight(router) == [0, 0]


async def test_stream_error_after_the_first_chunk_is_not_retried(
    router: WorkerPool, engines: list[ScriptedEngine]
) -> None:
    engines[0].script.append((1, InBandError("boom")))
    stream = await _forwarder(router).open_stream(_request())
    with pytest.raises(InBandError):
        async for _ in stream:
            pass
    await stream.close(InBandError("boom"))
    assert [len(engine.calls) for engine in engines] == [1, 0]
    assert _in_flight(router) == [0, 0]


async def test_closing_a_stream_early_closes_the_engine_iterator(
    router: WorkerPool, engines: list[ScriptedEngine]
) -> None:
    stream = await _forwarder(router).open_stream(_request())
    await stream.close()
    await stream.close()  # a second close changes nothing
    assert engines[0].closed_streams == 1
    assert _in_flight(router) == [0, 0]


def test_backoff_is_bounded_and_grows() -> None:
    policy = RetryPolicy(5, 0.1, 0.3)
    assert all(0 <= policy.delay(0) <= 0.1 for _ in range(100))
    assert all(0 <= policy.delay(5) <= 0.3 for _ in range(100))
    assert max(policy.delay(1) for _ in range(200)) > 0.1
