"""The Wilson score interval of a success rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from joynexus.algorithms.intervals import wilson_interval, z_of


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    [
        # Newcombe (1998), "Two-sided confidence intervals for the single proportion",
        # Table I, method 3 (score interval without continuity correction).
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        # Closed forms: p = 1/2 is centred; 0 of n has upper bound z²/(n + z²).
        (25, 50, 0.3664, 0.6336),
        (0, 50, 0.0, 0.0713),
        (50, 50, 0.9287, 1.0),
    ],
)
def test_matches_published_values(successes: int, trials: int, low: float, high: float) -> None:
    lo, hi = wilson_interval(successes, trials)
    assert lo == pytest.approx(low, abs=6e-5)
    assert hi == pytest.approx(high, abs=6e-5)


def test_z_of_95_percent() -> None:
    assert z_of(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert z_of(0.99) == pytest.approx(2.575829, abs=1e-6)


def test_contains_the_rate_narrows_with_episodes_and_widens_with_confidence() -> None:
    for n in (1, 7, 50, 400):
        for k in range(n + 1):
            lo, hi = wilson_interval(k, n)
            assert 0.0 <= lo <= k / n <= hi <= 1.0
    w50 = np.subtract(*reversed(wilson_interval(10, 50)))
    w500 = np.subtract(*reversed(wilson_interval(100, 500)))
    assert w500 < w50
    lo95, hi95 = wilson_interval(10, 50, 0.95)
    lo99, hi99 = wilson_interval(10, 50, 0.99)
    assert lo99 < lo95 and hi99 > hi95


def test_symmetric_under_swapping_successes_and_failures() -> None:
    lo, hi = wilson_interval(13, 50)
    lo2, hi2 = wilson_interval(37, 50)
    assert lo == pytest.approx(1 - hi2) and hi == pytest.approx(1 - lo2)


def test_covers_the_true_rate_about_95_percent_of_the_time() -> None:
    # Exact coverage over the binomial distribution (no sampling): Wilson keeps it
    # near the nominal level at n = 50 where the normal interval falls short.
    n, p = 50, 0.1
    coverage = 0.0
    for k in range(n + 1):
        lo, hi = wilson_interval(k, n)
        if lo <= p <= hi:
            coverage += math.comb(n, k) * p**k * (1 - p) ** (n - k)
    assert 0.93 <= coverage <= 0.99


@pytest.mark.parametrize(("successes", "trials"), [(0, 0), (-1, 5), (6, 5)])
def test_refuses_impossible_counts(successes: int, trials: int) -> None:
    with pytest.raises(ValueError, match=r"trials|successes"):
        wilson_interval(successes, trials)


def test_refuses_a_confidence_outside_0_1() -> None:
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 2, confidence=1.0)
