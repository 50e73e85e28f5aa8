"""The request path behind the routes: lease a worker, call its engine, retry, release.

Retries happen only before the first byte reaches the client: a retryable `EngineError`
(timeout, unreachable, overloaded, 429, 5xx) moves the request to a worker that has not
failed it yet, after an exponential backoff with full jitter. Every attempt has its own
telemetry operation (a CLIENT span) and its own lease, released exactly once.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from adapters.base import Completion, EngineRequest
from adapters.errors import EngineError, EngineOverloaded
from adapters.schema import Usage, probe_response
from proxy.router import Router, WorkerLease
from proxy.routing.config import RoutingSettings
from proxy.telemetry import Operation, Telemetry


@dataclass(slots=True, frozen=True)
class RetryPolicy:
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float

    @classmethod
    def from_settings(cls, settings: RoutingSettings) -> RetryPolicy:
        return cls(settings.max_attempts, settings.backoff_base_s, settings.backoff_max_s)

    def delay(self, retry: int) -> float:
        """Seconds before retry number `retry` (0-based): uniform in [0, min(max, base * 2**retry)]."""
        return random.uniform(0.0, min(self.backoff_max_s, self.backoff_base_s * (2**retry)))


class UpstreamStream:
    """An engine stream whose first chunk has arrived. Iterate it for the rest, then `close`.

    The time to first token is taken at the first chunk that carries output (content, reasoning or a
    tool call): a chat stream opens with an empty role chunk, often long before the first token."""

    __slots__ = (
        "_ended",
        "_finish_reasons",
        "_first_token_seen",
        "_iterator",
        "_lease",
        "_model",
        "_op",
        "_response_id",
        "_usage",
        "first",
    )

    def __init__(
        self, first: bytes, iterator: AsyncIterator[bytes], lease: WorkerLease, op: Operation
    ) -> None:
        self.first = first
        self._iterator = iterator
        self._lease = lease
        self._op = op
        self._usage: Usage | None = None
        self._response_id: str | None = None
        self._model: str | None = None
        self._finish_reasons: list[str] = []
        self._ended = False
        self._first_token_seen = False
        self._observe(first)

    @property
    def usage(self) -> Usage | None:
        """The usage the stream reported so far (its last chunk, with `include_usage`)."""
        return self._usage

    def __aiter__(self) -> UpstreamStream:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._iterator.__anext__()
        self._observe(chunk)
        return chunk

    async def close(self, error: BaseException | None = None) -> None:
        """Stop the engine stream (closing its connection) and end the attempt's span and lease."""
        if self._ended:
            return
        self._ended = True
        try:
            await _aclose(self._iterator)
        finally:
            if error is None:
                self._op.succeed(
                    response_id=self._response_id,
                    response_model=self._model,
                    finish_reasons=self._finish_reasons,
                    usage=self._usage,
                )
            else:
                self._op.fail(error)
            self._lease.release(usage=self._usage, failed=_worker_fault(error))

    def _observe(self, chunk: bytes) -> None:
        try:
            probe = probe_response(chunk)
        except msgspec.DecodeError:
            return
        if probe.id is not None and self._response_id is None:
            self._response_id = probe.id
            self._model = probe.model
        # Output is looked for until the first token, and after it only when chunk gaps are timed.
        look = not self._first_token_seen or self._op.times_chunks
        output = False
        for choice in probe.choices:
            if choice.finish_reason:
                self._finish_reasons.append(choice.finish_reason)
            if look and not output:
                output = choice.carries_token
        if output:
            if self._first_token_seen:
                self._op.next_chunk()
            else:
                self._first_token_seen = True
                self._op.first_chunk()
        if probe.usage is not None:
            self._usage = probe.usage


class Forwarder:
    """Sends `EngineRequest`s to the workers the router picks."""

    __slots__ = ("_retry", "_router", "_telemetry")

    def __init__(self, router: Router, telemetry: Telemetry, retry: RetryPolicy) -> None:
        self._router = router
        self._telemetry = telemetry
        self._retry = retry

    async def complete(self, request: EngineRequest) -> Completion:
        """A whole answer, from the first worker that gives one within the retry budget."""
        excluded: frozenset[str] = frozenset()
        last_error: EngineError | None = None
        started = time.perf_counter()
        for attempt in range(self._retry.max_attempts):
            lease, op = await self._start(request, excluded, last_error, started)
            try:
                completion = await lease.engine.complete(request)
            except EngineError as exc:
                op.fail(exc)
                lease.release(usage=None, failed=_worker_fault(exc))
                if not exc.retryable or attempt + 1 == self._retry.max_attempts:
                    raise
                excluded, last_error = excluded | {lease.worker_id}, exc
                await asyncio.sleep(self._retry.delay(attempt))
                continue
            except BaseException as exc:  # cancelled (the client went away) or a bug: not the worker's fault
                op.fail(exc)
                lease.release(usage=None, failed=False)
                raise
            op.succeed(
                response_id=completion.response_id,
                response_model=completion.response_model,
                finish_reasons=completion.finish_reasons,
                usage=completion.usage,
            )
            lease.release(usage=completion.usage, failed=False)
            return completion
        raise AssertionError("max_attempts >= 1 is enforced by the settings")

    async def open_stream(self, request: EngineRequest) -> UpstreamStream:
        """A stream whose first chunk has arrived; errors before it are retried like `complete`'s."""
        excluded: frozenset[str] = frozenset()
        last_error: EngineError | None = None
        started = time.perf_counter()
        for attempt in range(self._retry.max_attempts):
            lease, op = await self._start(request, excluded, last_error, started)
            iterator = lease.engine.stream(request)
            try:
                first = await iterator.__anext__()
            except StopAsyncIteration:
                error = EngineError("the upstream ended the stream before sending any chunk")
                await _abandon(iterator, op, lease, error)
                raise error from None
            except EngineError as exc:
                await _abandon(iterator, op, lease, exc)
                if not exc.retryable or attempt + 1 == self._retry.max_attempts:
                    raise
                excluded, last_error = excluded | {lease.worker_id}, exc
                await asyncio.sleep(self._retry.delay(attempt))
                continue
            except BaseException as exc:
                await _abandon(iterator, op, lease, exc)
                raise
            return UpstreamStream(first, iterator, lease, op)
        raise AssertionError("max_attempts >= 1 is enforced by the settings")

    async def _start(
        self,
        request: EngineRequest,
        excluded: frozenset[str],
        last_error: EngineError | None,
        started: float,
    ) -> tuple[WorkerLease, Operation]:
        try:
            lease = await self._router.acquire(request, exclude=excluded)
        except EngineOverloaded:
            # Every worker has failed this request: the client learns why the last one failed.
            if last_error is not None:
                raise last_error from None
            raise
        op = self._telemetry.start_operation(request, lease.engine)
        op.request_started = started  # the server-side timings count retries and their backoff
        request.trace_headers = op.trace_headers
        if request.route is not None:
            request.route.served_by = lease.worker_id
        return lease, op


def _worker_fault(error: BaseException | None) -> bool:
    """Failures that say something about the worker (for health and breakers), not the client."""
    return isinstance(error, EngineError) and error.retryable


async def _abandon(
    iterator: AsyncIterator[bytes], op: Operation, lease: WorkerLease, error: BaseException
) -> None:
    try:
        await _aclose(iterator)
    finally:
        op.fail(error)
        lease.release(usage=None, failed=_worker_fault(error))


async def _aclose(iterator: AsyncIterator[bytes]) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()
