"""Small statistics for tests (no SciPy in the project): the two-sample Kolmogorov-Smirnov test."""

from __future__ import annotations

import math
from collections.abc import Sequence


def ks_two_sample(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """(D, p): the largest gap between the two empirical distributions, and its p-value under the
    null hypothesis that both samples come from one distribution (the asymptotic Kolmogorov
    distribution with Stephens' small-sample correction)."""
    a, b = sorted(first), sorted(second)
    n, m = len(a), len(b)
    i = j = 0
    gap = 0.0
    while i < n and j < m:
        value = min(a[i], b[j])
        while i < n and a[i] <= value:
            i += 1
        while j < m and b[j] <= value:
            j += 1
        gap = max(gap, abs(i / n - j / m))
    effective = math.sqrt(n * m / (n + m))
    lam = (effective + 0.12 + 0.11 / effective) * gap
    if lam < 1e-3:
        return gap, 1.0
    total = sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return gap, min(1.0, max(0.0, 2 * total))
