"""`[cache] warm_file`: warm the caches at start from a JSONL file, in the background.

One item per line (blank lines are skipped):

    "You are a support agent for ACME. ..."                    a prompt: prefilled (one greedy token,
                                                                answer not stored) for `model`
    {"messages": [...], "temperature": 0}                       a whole chat request
    {"prompt": "...", "max_tokens": 16, "model": "other"}       a whole text-completion request

`model` defaults to the gateway's first model. Items run as `POST /v1/cache/warm` runs them
(`proxy.cache.warm`), at most `WARM_CONCURRENCY` at a time, as the anonymous tenant (`[auth]
anonymous_tenant`; with API keys, warm each tenant's prefixes through the endpoint with its key).

The run starts once the app has started and never delays readiness: requests are served while it
runs. Its progress is logged (start, every `LOG_EVERY` items, end) and reported in `warming` of
`/v1/cache/stats`. A line that is not JSON, or not a string or an object, is logged and counted as
failed; the other lines still run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from proxy.auth import Tenant, cache_salt
from proxy.cache.warm import WARM_CONCURRENCY, WarmItem, prefill_body, warm_one
from proxy.gateway import Gateway

logger = logging.getLogger("radixgate.cache")

LOG_EVERY = 50
"""Items between two progress lines in the log."""

WarmState = Literal["pending", "running", "done"]


@dataclass(slots=True)
class WarmProgress:
    """Where the warm file's run stands (read by `/v1/cache/stats`)."""

    file: str
    state: WarmState = "pending"
    items: int = 0
    done: int = 0
    failed: int = 0
    cached_tokens: int = 0
    """Prompt tokens the engines already held when the items ran (an earlier run, or the disk)."""
    started_at: float | None = None
    seconds: float | None = None
    errors: list[str] = field(default_factory=list)
    """The first few failures, for the operator."""


MAX_REPORTED_ERRORS = 5


class WarmFileRunner:
    """Runs one warm file once, in a task started by the cache layer's lifespan."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.progress = WarmProgress(file=str(path))
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.progress.state == "running"

    def start(self, gateway: Gateway) -> None:
        """Begin the run in the background."""
        self._task = asyncio.get_running_loop().create_task(self._run(gateway), name="radixgate-warm-file")

    async def stop(self) -> None:
        """Cancel a run still going (shutdown)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, gateway: Gateway) -> None:
        progress = self.progress
        progress.state, progress.started_at = "running", time.time()
        started = time.monotonic()
        try:
            items = await asyncio.to_thread(self._read, gateway)
            progress.items = len(items) + progress.failed
            logger.info("warming from %s: %d items", self.path, progress.items)
            auth = gateway.settings.auth
            anonymous = auth.anonymous_tenant
            tenant = Tenant(anonymous, cache_salt(auth.cache_salt_secret, anonymous))
            limit = asyncio.Semaphore(WARM_CONCURRENCY)

            async def run(index: int, prefill_only: bool, fields: dict[str, Any]) -> None:
                async with limit:
                    self._count(await warm_one(gateway, tenant, index, prefill_only, fields))

            await asyncio.gather(*(run(index, *item) for index, item in items))
        except OSError as exc:
            self._fail(f"cannot read {self.path}: {exc}")
        finally:
            progress.state, progress.seconds = "done", round(time.monotonic() - started, 3)
            logger.info(
                "warming from %s done in %.1f s: %d of %d items warmed, %d failed, %d tokens were cached",
                self.path,
                progress.seconds,
                progress.done - progress.failed,
                progress.items,
                progress.failed,
                progress.cached_tokens,
            )

    def _read(self, gateway: Gateway) -> list[tuple[int, tuple[bool, dict[str, Any]]]]:
        """(line number, (prefill only, request body)) of every valid line; the others are failed."""
        models = gateway.router.model_ids()
        model = models[0] if models else ""
        items: list[tuple[int, tuple[bool, dict[str, Any]]]] = []
        with self.path.open("rb") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    value = msgspec.json.decode(line)
                except msgspec.DecodeError as exc:
                    self._fail(f"line {number}: not JSON ({exc})")
                    continue
                if isinstance(value, str):
                    items.append((number, (True, prefill_body(model, value))))
                elif isinstance(value, dict):
                    items.append((number, (False, {"model": model, **value})))
                else:
                    self._fail(f"line {number}: expected a prompt string or a request object")
        return items

    def _count(self, item: WarmItem) -> None:
        progress = self.progress
        progress.done += 1
        progress.cached_tokens += item.cached_tokens or 0
        if item.status == "error":
            message = item.error.message if item.error is not None else "failed"
            self._fail(f"line {item.index}: {message}", counted=True)
        if progress.done % LOG_EVERY == 0:
            logger.info("warming from %s: %d of %d items run", self.path, progress.done, progress.items)

    def _fail(self, message: str, *, counted: bool = False) -> None:
        progress = self.progress
        progress.failed += 1
        if not counted:
            progress.done += 1
        if len(progress.errors) < MAX_REPORTED_ERRORS:
            progress.errors.append(message)
        logger.warning("warming from %s: %s", self.path, message)
