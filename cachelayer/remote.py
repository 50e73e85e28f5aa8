"""Optional Redis tier, shared by gateway replicas. Off unless configured.

Values are stored as ``f64 expires_at | f64 cost | data`` (little-endian) under
``key_prefix + key.hex()``, with Redis's own expiry set to the TTL. Redis applies its own memory
limit and eviction (``maxmemory``/``maxmemory-policy``), so this tier has no budget of its own.

The tier never raises into the caller: a failed call (server gone, timeout) counts an error, is
answered as a miss or a no-op, and the tier stays quiet for ``retry_after_s`` before trying again,
so a dead Redis costs one timeout per interval, not one per request.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachelayer.stats import TierCounters, TierSnapshot
from cachelayer.tier import Entry

__all__ = [
    "DEFAULT_REDIS_RETRY_AFTER_S",
    "DEFAULT_REDIS_TIMEOUT_S",
    "RedisTier",
    "RedisTierConfig",
]

DEFAULT_REDIS_TIMEOUT_S = 0.25
DEFAULT_REDIS_RETRY_AFTER_S = 5.0

_META = struct.Struct("<dd")
_CLEAR_BATCH = 500


@dataclass(frozen=True, slots=True)
class RedisTierConfig:
    """The Redis tier."""

    url: str
    """``redis://host:port/db`` (``rediss://`` for TLS)."""
    name: str = "redis"
    """Name in stats and metrics."""
    key_prefix: str = "radixgate:"
    """Namespace for this deployment's keys; ``clear`` deletes only keys under it."""
    timeout_s: float = DEFAULT_REDIS_TIMEOUT_S
    """Connect and socket timeout per call."""
    retry_after_s: float = DEFAULT_REDIS_RETRY_AFTER_S
    """After a failure, answer misses without calling Redis for this long."""
    share_on_put: bool = True
    """Write every stored value here at once (so other replicas see it), not only demoted ones."""


class RedisTier:
    """See the module docstring."""

    def __init__(
        self,
        config: RedisTierConfig,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Create the client (no connection is made until the first call)."""
        # Imported here: every process that loads the cache layer would otherwise pay ~8 MiB of RSS
        # for a client that only a configured Redis tier uses.
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._errors: tuple[type[Exception], ...] = (redis.RedisError, OSError)
        self.name = config.name
        self.demotes = False  # Redis evicts on its own: nothing ever comes back from a put
        self.config = config
        self._clock = clock
        self._monotonic = monotonic
        self._prefix = config.key_prefix.encode()
        self._client = redis.Redis.from_url(
            config.url,
            socket_timeout=config.timeout_s,
            socket_connect_timeout=config.timeout_s,
            retry=Retry(NoBackoff(), 0),  # our own back-off below; redis-py's would stall callers
        )
        self._quiet_until = 0.0
        self._counters = TierCounters()

    @property
    def available(self) -> bool:
        """False while backing off after a failure."""
        return self._monotonic() >= self._quiet_until

    def get(self, key: bytes) -> Entry | None:
        """The entry for ``key``, or None (also when Redis is unreachable)."""
        self._counters.queries += 1
        blob = self._call(lambda: self._client.get(self._prefix + key.hex().encode()))
        if not isinstance(blob, bytes) or len(blob) < _META.size:
            self._counters.misses += 1
            return None
        expires, cost = _META.unpack_from(blob)
        if expires and expires <= self._clock():  # Redis expiry has millisecond grain
            self._counters.misses += 1
            self._counters.expirations += 1
            return None
        self._counters.hits += 1
        return Entry(data=blob[_META.size :], expires_at=expires or None, cost=cost)

    def contains(self, key: bytes) -> bool:
        """Whether Redis holds ``key`` (False when unreachable)."""
        found = self._call(lambda: self._client.exists(self._prefix + key.hex().encode()))
        return isinstance(found, int) and found > 0

    def put(self, key: bytes, entry: Entry) -> list[tuple[bytes, Entry]]:
        """Store ``entry`` with Redis expiry at its TTL; Redis evicts on its own, so nothing comes back."""
        blob = _META.pack(entry.expires_at or 0.0, entry.cost) + entry.data
        name = self._prefix + key.hex().encode()
        if entry.expires_at is None:
            done = self._call(lambda: self._client.set(name, blob))
        else:
            ttl_ms = int((entry.expires_at - self._clock()) * 1000)
            if ttl_ms <= 0:
                return []
            done = self._call(lambda: self._client.set(name, blob, px=ttl_ms))
        if done is not None:
            self._counters.puts += 1
        return []

    def delete(self, key: bytes) -> bool:
        """Drop ``key``; True when Redis had it."""
        removed = self._call(lambda: self._client.delete(self._prefix + key.hex().encode()))
        return isinstance(removed, int) and removed > 0

    def clear(self) -> None:
        """Delete every key under ``key_prefix`` (other deployments' keys stay)."""

        def scan_and_delete() -> int:
            batch: list[bytes] = []
            for name in self._client.scan_iter(match=self._prefix + b"*", count=_CLEAR_BATCH):
                batch.append(name)
                if len(batch) >= _CLEAR_BATCH:
                    self._client.unlink(*batch)
                    batch.clear()
            if batch:
                self._client.unlink(*batch)
            return 0

        self._call(scan_and_delete)

    def stats(self) -> TierSnapshot:
        """Counters; size is unknown (Redis may be shared and manages its own memory)."""
        return self._counters.snapshot(
            name=self.name, kind="redis", policy="server", size=None, entries=None, capacity=None
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def _call(self, action: Callable[[], object]) -> object | None:
        if not self.available:
            return None
        try:
            return action()
        except self._errors:
            self._counters.errors += 1
            self._quiet_until = self._monotonic() + self.config.retry_after_s
            return None
