"""Verdicts from paired seeds: the one rule every computed finding of fedhet uses (result pages' claims,
the gated FSSL protocol's ordering).

The paired differences d_s = better_s − than_s (same seed: same split and initial model), their mean and a
95 % Student-t interval: **holds** only when the interval excludes 0 in the claimed direction,
**contradicted** when it excludes 0 the other way, otherwise **not resolved** (one seed, or differences with
no spread, have no interval). A target that tolerates a loss (the robustness page: "within 2 points of the
clean run") uses the same interval against the margin instead of 0 (:func:`judge_margin`): **meets**,
**misses**, or **not resolved**.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats

HOLDS, CONTRADICTED, UNRESOLVED = "holds", "contradicted", "not resolved"
MEETS, MISSES = "meets", "misses"


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


def judge_margin(
    differences: Sequence[float], margin: float, level: float = 0.95
) -> tuple[str, float, float, float]:
    """(verdict, mean, low, high) of the paired differences after − before (higher is better) against a
    tolerated loss ``margin`` ≥ 0: **meets** when the whole Student-t interval lies above −margin, **misses**
    when it lies below, otherwise **not resolved** (the seeds cannot tell). Fewer than two differences have
    no interval: not resolved, low and high NaN (mean NaN too with none). Differences that are all equal
    give the interval [d, d]: unlike a 0/1 count (:func:`judge`), an accuracy change measured the same at
    every seed is a change without seed-to-seed spread, judged as it is."""
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin={margin!r}: the tolerated loss must be a finite number >= 0")
    values = [float(d) for d in differences]
    if not all(math.isfinite(d) for d in values):
        raise ValueError(
            f"paired differences {values} hold a non-finite value; drop or repair that run first"
        )
    if len(values) < 2:
        mean = values[0] if values else float("nan")
        return UNRESOLVED, mean, float("nan"), float("nan")
    mean, low, high = paired_interval(values, level)
    if low > -margin:
        return MEETS, mean, low, high
    if high < -margin:
        return MISSES, mean, low, high
    return UNRESOLVED, mean, low, high
