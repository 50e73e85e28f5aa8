"""The hand-written KS test against known values."""

from __future__ import annotations

import random

from tests.stats import ks_two_sample


def test_identical_samples_are_not_told_apart() -> None:
    sample = [random.Random(1).random() for _ in range(50)]
    assert ks_two_sample(sample, sample) == (0.0, 1.0)


def test_shifted_samples_are_told_apart_and_like_ones_are_not() -> None:
    rng = random.Random(7)
    base = [rng.gauss(0, 1) for _ in range(40)]
    same = [rng.gauss(0, 1) for _ in range(40)]
    shifted = [rng.gauss(2, 1) for _ in range(40)]
    assert ks_two_sample(base, same)[1] > 0.05
    gap, p = ks_two_sample(base, shifted)
    assert gap > 0.5 and p < 1e-6


def test_disjoint_samples_of_ten() -> None:
    gap, p = ks_two_sample(list(range(10)), list(range(100, 110)))
    assert gap == 1.0 and p < 1e-3  # SciPy's asymptotic p for this case is 4.1e-5
