"""Confidence intervals of success rates (Wilson score interval).

A success rate measured over ``n`` evaluation episodes is a binomial proportion; the
Wilson score interval keeps its coverage near the nominal level for small ``n`` and for
rates near 0 or 1, where the normal ("Wald") interval collapses to a point (0 of 50
successes would read as exactly 0 %). It is what the run summary reports beside every
success rate, so that "before" and "after" can be compared honestly.
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = ["wilson_interval", "z_of"]


def z_of(confidence: float) -> float:
    """The two-sided standard-normal quantile of ``confidence`` (0.95 → 1.959964).

    Raises:
        ValueError: ``confidence`` is not in (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``trials``.

    Args:
        successes: Successful episodes, ``0 <= successes <= trials``.
        trials: Episodes, at least 1.
        confidence: Two-sided confidence level (0.95 for a 95 % interval).

    Returns:
        ``(low, high)`` with ``0 <= low <= successes / trials <= high <= 1``.

    Raises:
        ValueError: ``trials`` < 1 or ``successes`` outside ``[0, trials]``.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    z = z_of(confidence)
    p = successes / trials
    z2n = z * z / trials
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z * math.sqrt(p * (1.0 - p) / trials + z2n / (4.0 * trials)) / (1.0 + z2n)
    # Exact bounds at the edges: rounding must not push 0/n above 0 or n/n below 1.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high
