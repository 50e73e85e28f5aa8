"""Is loading an offloaded page cheaper than recomputing it? Running estimates of both.

- Recompute: the engine's prefill speed in tokens/s, measured on every step that computed at least
  `MIN_PREFILL_SAMPLE_TOKENS` prompt tokens (the step's few decode rows make it slightly pessimistic).
- Load: per tier (`kv_l2` memory, `kv_l3` disk), bytes/s measured over every load from that tier
  (store lookup, checksum, copy into the pool).

Both are exponentially weighted moving averages, so they follow a machine that gets busier. A page
is loaded when `load seconds * min_speedup <= recompute seconds`. Until both figures are measured
there is nothing to weigh, and pages are loaded: the first load is what measures the tier.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EWMA_WEIGHT = 0.3
"""Weight of a new sample in a running estimate."""
MIN_PREFILL_SAMPLE_TOKENS = 32
"""Smaller prefill steps are dominated by fixed per-step costs and would understate the speed."""


@dataclass(slots=True)
class RateEstimate:
    """An exponentially weighted units/second figure (None before the first sample)."""

    per_second: float | None = None
    samples: int = 0

    def observe(self, amount: float, seconds: float) -> None:
        """Fold in `amount` units done in `seconds`."""
        if amount <= 0 or seconds <= 0:
            return
        rate = amount / seconds
        current = self.per_second
        self.per_second = rate if current is None else (1 - EWMA_WEIGHT) * current + EWMA_WEIGHT * rate
        self.samples += 1


@dataclass(slots=True)
class LoadCostModel:
    """Weighs a page load from one tier against recomputing the page's tokens."""

    min_speedup: float
    """Load only when loading is estimated at least this many times faster than recomputing."""
    prefill: RateEstimate = field(default_factory=RateEstimate)
    """Prompt tokens per second."""
    tiers: dict[str, RateEstimate] = field(default_factory=dict)
    """Bytes per second, per tier name."""

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """One engine step that computed `tokens` prompt tokens in `seconds`."""
        if tokens >= MIN_PREFILL_SAMPLE_TOKENS:
            self.prefill.observe(tokens, seconds)

    def observe_load(self, tier: str, nbytes: int, seconds: float) -> None:
        """`nbytes` loaded from `tier` in `seconds`."""
        self.tiers.setdefault(tier, RateEstimate()).observe(nbytes, seconds)

    def worth_loading(self, tier: str, nbytes: int, tokens: int) -> bool:
        """Whether loading `nbytes` from `tier` beats recomputing `tokens` (True while unmeasured)."""
        load = self.tiers.get(tier)
        if self.prefill.per_second is None or load is None or load.per_second is None:
            return True
        load_s = nbytes / load.per_second
        recompute_s = tokens / self.prefill.per_second
        return load_s * self.min_speedup <= recompute_s
