"""A circuit breaker per worker, fed by the outcome of real requests.

    closed --(failure_threshold consecutive failures)--> open
    open --(cooldown elapsed)--> half_open: one trial request at a time
    half_open --(trial succeeds)--> closed
    half_open --(trial fails)--> open, with the cooldown doubled (up to max_cooldown_s)

Health checks decide whether a worker is up; the breaker reacts faster, to the requests themselves,
and keeps a worker that answers health checks but fails requests out of rotation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from proxy.routing.config import BreakerSettings

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(slots=True)
class CircuitBreaker:
    """Tracks consecutive failures of one worker and says whether it may take a request."""

    settings: BreakerSettings
    clock: Callable[[], float] = time.monotonic
    state: BreakerState = "closed"
    failures: int = 0
    opened_count: int = 0
    """How many times the circuit opened (for the admin API and metrics)."""
    _cooldown_s: float = 0.0
    _open_until: float = 0.0
    _trial_in_flight: bool = False
    _on_change: list[Callable[[BreakerState], None]] = field(default_factory=list)

    def allows(self) -> bool:
        """True when a request may be sent now (without reserving the half-open trial)."""
        if self.state == "open" and self.clock() >= self._open_until:
            self._set("half_open")
        if self.state == "half_open":
            return not self._trial_in_flight
        return self.state == "closed"

    def on_dispatch(self) -> None:
        """A request was sent; in half-open state it is the one trial."""
        if self.state == "half_open":
            self._trial_in_flight = True

    def record(self, *, failed: bool) -> None:
        """Feed the outcome of one request."""
        if not failed:
            self.failures = 0
            self._trial_in_flight = False
            if self.state != "closed":
                self._cooldown_s = 0.0
                self._set("closed")
            return
        self.failures += 1
        if self.state == "half_open":
            self._trial_in_flight = False
            self._open(min(self._cooldown_s * 2, self.settings.max_cooldown_s))
        elif self.state == "closed" and self.failures >= self.settings.failure_threshold:
            self._open(self.settings.cooldown_s)

    def trip(self) -> None:
        """Open at once (the worker was found down by a health check or removed)."""
        if self.state != "open":
            self._open(self._cooldown_s or self.settings.cooldown_s)

    def reset(self) -> None:
        """Close (a health check found the worker back)."""
        self.failures = 0
        self._trial_in_flight = False
        self._cooldown_s = 0.0
        if self.state != "closed":
            self._set("closed")

    def subscribe(self, callback: Callable[[BreakerState], None]) -> None:
        """Call `callback(new_state)` on every transition."""
        self._on_change.append(callback)

    def _open(self, cooldown_s: float) -> None:
        self._cooldown_s = cooldown_s
        self._open_until = self.clock() + cooldown_s
        self.opened_count += 1
        self._set("open")

    def _set(self, state: BreakerState) -> None:
        self.state = state
        for callback in self._on_change:
            callback(state)
