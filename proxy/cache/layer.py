"""`CacheLayer`: the cache of one gateway app, built from its settings.

cache = CacheLayer.from_settings(settings, telemetry.prometheus, router)
gateway = Gateway(..., cache=cache.step)                     # the request path's step
Litestar([..., *admin_handlers(gateway, cache)], lifespan=[..., cache.lifespan])
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from opentelemetry.trace import Tracer

from cachelayer.admission import AdmissionGate
from cachelayer.disk import CacheDirLockedError
from cachelayer.responses import ResponseCache
from cachelayer.stats import StoreSnapshot
from cachelayer.tiers import TieredStore
from proxy.cache import metrics
from proxy.cache.alerts import AlertBook
from proxy.cache.config import ContextCacheConfig, cache_config
from proxy.cache.counters import CacheMonitor
from proxy.cache.settings import CacheSettings, CacheSettingsError
from proxy.cache.step import ResponseCacheStep
from proxy.cache.warm_file import WarmFileRunner
from proxy.config import SettingsError
from proxy.routing.pool import WorkerPool
from proxy.settings import Settings
from proxy.telemetry.prometheus import MetricsRegistry

logger = logging.getLogger("radixgate.cache")


class CacheLayer:
    """Owns the response cache's store and its counters (`proxy.cache.admin_routes` serves them)."""

    def __init__(
        self,
        config: ContextCacheConfig,
        settings: CacheSettings,
        responses: ResponseCache | None,
        monitor: CacheMonitor,
        router: WorkerPool,
        tracer: Tracer | None = None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.responses = responses
        self.monitor = monitor
        self.router = router
        admission = AdmissionGate(settings.admission, min_hit_rate=settings.admission_min_hit_rate)
        self.step = ResponseCacheStep(responses, monitor, admission, tracer)
        self.alerts = AlertBook()
        """Since when each alert of `/v1/cache/stats` has held."""
        self.warmer = WarmFileRunner(settings.warm_file) if settings.warm_file is not None else None
        """Runs `[cache] warm_file` in the background once the app has started."""

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        registry: MetricsRegistry | None,
        router: WorkerPool,
        tracer: Tracer | None = None,
    ) -> CacheLayer:
        """Open the store (and its L3 directory) and register the metrics when monitoring is on;
        `tracer` gives each lookup a span.

        Raises `SettingsError` naming the key when the configuration is invalid or the directory unusable.
        """
        try:
            config = cache_config(settings)
        except CacheSettingsError as exc:  # settings built in code skip `load_settings`'s check
            raise SettingsError(f"invalid setting {exc.key}: {exc.message}") from exc
        warm_file = settings.cache.warm_file
        if warm_file is not None and not warm_file.is_file():
            raise SettingsError(f"invalid setting cache.warm_file: {warm_file} is not a readable file")
        responses = None
        if settings.cache.response_cache:
            try:
                store = TieredStore.from_config(config.response_store(settings.cache))
            except (OSError, CacheDirLockedError) as exc:
                raise SettingsError(f"invalid setting cache.dir: {exc}") from exc
            responses = ResponseCache(store, share_across_tenants=settings.cache.share_across_tenants)
        elif settings.cache.dir is not None:
            logger.warning("cache.dir is set but the response cache is off; nothing is written there")
        monitoring = config.monitoring
        monitor = CacheMonitor(
            trend_interval_s=monitoring.collection_interval_seconds, sample_trends=monitoring.enabled
        )
        layer = cls(config, settings.cache, responses, monitor, router, tracer)
        if registry is not None:
            monitor.hit_seconds = metrics.hit_histogram(registry)
        if registry is not None and monitoring.enabled:
            monitor.profile = metrics.register(
                registry,
                layer.store_stats,
                monitor,
                router,
                detailed_profiling=monitoring.detailed_profiling,
            )
        return layer

    def store_stats(self) -> StoreSnapshot | None:
        """The response store's counters, None when the response cache is off."""
        return self.responses.stats() if self.responses is not None else None

    async def store_stats_async(self) -> StoreSnapshot | None:
        """`store_stats` off the loop when a tier may be busy with I/O under the store's lock."""
        if self.responses is not None and self.responses.blocking:
            return await asyncio.to_thread(self.responses.stats)
        return self.store_stats()

    @asynccontextmanager
    async def lifespan(self, app: Litestar) -> AsyncIterator[None]:
        """After start: begin the warm file's run. On shutdown: stop it, finish storing answers in
        flight, then close the store's files and connections (queued disk writes get
        `cache.shutdown_flush_s`)."""
        if self.warmer is not None:
            self.warmer.start(app.state.gateway)
        try:
            yield
        finally:
            if self.warmer is not None:
                await self.warmer.stop()
            deadline = time.monotonic() + self.settings.shutdown_flush_s
            await self.step.drain()
            if self.responses is not None:
                await asyncio.to_thread(self.responses.close, deadline)
