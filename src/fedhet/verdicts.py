"""Verdicts from paired seeds: the one rule every computed finding of fedhet uses (result pages' claims,
the gated FSSL protocol's ordering).

The paired differences d_s = better_s − than_s (same seed: same split and initial model), their mean and a
95 % Student-t interval: **holds** only when the interval excludes 0 in the claimed direction,
**contradicted** when it excludes 0 the other way, otherwise **not resolved** (one seed, or differences with
no spread, have no interval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats

HOLDS, CONTRADICTED, UNRESOLVED = "holds", "contradicted", "not resolved"


def paired_interval(differences: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of the paired differences and its two-sided Student-t interval (n ≥ 2)."""
    n = len(differences)
    mean = math.fsum(differences) / n
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def judge(
    differences: Sequence[float], lower_is_better: bool = False
) -> tuple[str, float | None, float | None]:
    """(verdict, low, high) of the paired differences better − than. Differences that are all equal (a
    metric counting 0 or 1 per seed, say) have no spread to build a t-interval from: not resolved, however
    many seeds agree (low and high None)."""
    if len(differences) < 2 or max(differences) == min(differences):
        return UNRESOLVED, None, None
    _, low, high = paired_interval(differences)
    good_low, good_high = (-high, -low) if lower_is_better else (low, high)
    if good_low > 0:
        return HOLDS, low, high
    if good_high < 0:
        return CONTRADICTED, low, high
    return UNRESOLVED, low, high
