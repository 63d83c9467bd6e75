"""Federated statistics of a table's features: what each client reports about its own rows, and what the
server makes of the reports. Nothing here sees another client's rows.

Standardisation: each client reports, for its own rows, the count, the per-feature sum and sum of squares
(:func:`client_feature_statistics` — never a row), and the server combines them into per-feature mean and
std (:func:`combine_feature_statistics`). The statistics are self-reported: a client that lies shifts every
client's inputs. One-hot columns are not standardised (mean 0, std 1).

Imputation (``data.impute``): the fill value of one numeric column from the clients' reports on its present
(non-missing) values — the mean from counts and sums (:func:`client_present_sum`), the most frequent value
from value counts (:func:`client_value_counts`), and the exact median by bisection, where each client only
answers how many of its values are <= a threshold the server sends (:func:`client_count_at_most`,
:func:`federated_order_statistic`): at most 64 questions per order statistic, one count per client each.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedhet.errors import DataError


@dataclass(frozen=True)
class FeatureStatistics:
    """What one client reports about its rows' numeric features: count, sums, sums of squares (float64)."""

    count: int
    total: np.ndarray
    total_sq: np.ndarray


def client_feature_statistics(rows: np.ndarray) -> FeatureStatistics:
    """A client's report on its own rows (N_i, F): count, per-feature sum and sum of squares."""
    values = np.asarray(rows, dtype=np.float64)
    return FeatureStatistics(len(values), values.sum(axis=0), np.square(values).sum(axis=0))


def combine_feature_statistics(
    reports: Sequence[FeatureStatistics], numeric: Sequence[bool]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-feature mean and population std from the clients' reports (the server's side).

    mean = Σ sums / Σ counts, var = Σ squares / Σ counts − mean²; a constant column gets std 1 (it
    standardises to 0 instead of dividing by zero); non-numeric (one-hot) columns get mean 0, std 1.
    """
    count = sum(r.count for r in reports)
    if count == 0:
        raise DataError("no client reported any rows: the federation has no training data")
    mean = sum(r.total for r in reports) / count
    var = np.maximum(sum(r.total_sq for r in reports) / count - mean**2, 0.0)
    std = np.sqrt(var)
    std = np.where(std > 1e-12 * np.maximum(1.0, np.abs(mean)), std, 1.0)
    keep = np.asarray(numeric, dtype=bool)
    return (
        tuple(float(m) if k else 0.0 for m, k in zip(mean, keep, strict=True)),
        tuple(float(s) if k else 1.0 for s, k in zip(std, keep, strict=True)),
    )


# --------------------------------------------------------------------------------------------------------
# Imputation: the fill value of one numeric column from the clients' reports on its present values
# --------------------------------------------------------------------------------------------------------
#: The accepted ``data.impute`` strategies (None: missing numbers are refused).
IMPUTE_STRATEGIES = ("mean", "median", "most_frequent")


@dataclass(frozen=True)
class PresentSum:
    """What one client reports for the mean: how many of its values of the column are present, their sum."""

    count: int
    total: float


def _present(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values[~np.isnan(values)]


def client_present_sum(values: np.ndarray) -> PresentSum:
    """A client's report on one column of its rows (NaN = missing): count and sum of the present values."""
    present = _present(values)
    return PresentSum(int(present.size), float(present.sum()))


def client_value_counts(values: np.ndarray) -> dict[float, int]:
    """A client's report on one column of its rows: how often each present value occurs (it reveals the
    values, as a categorical column's vocabulary does)."""
    distinct, counts = np.unique(_present(values), return_counts=True)
    return {float(v): int(c) for v, c in zip(distinct, counts, strict=True)}


def client_count_at_most(values: np.ndarray, threshold: float) -> int:
    """A client's answer to the median bisection: how many of its present values are <= ``threshold`` (a
    missing value, NaN, compares false)."""
    return int(np.count_nonzero(np.asarray(values, dtype=np.float64) <= threshold))


def federated_mean(reports: Sequence[PresentSum]) -> float:
    """The column's mean over every client's present values: Σ sums / Σ counts."""
    count = sum(r.count for r in reports)
    if count == 0:
        raise DataError("no client reported a present value: the column has no mean")
    return sum(r.total for r in reports) / count


def federated_most_frequent(reports: Sequence[Mapping[float, int]]) -> float:
    """The value the clients' summed value counts make most frequent; a tie goes to the smallest value (as
    scikit-learn's SimpleImputer)."""
    totals: dict[float, int] = {}
    for report in reports:
        for value, count in report.items():
            totals[value] = totals.get(value, 0) + count
    if not totals:
        raise DataError("no client reported a present value: the column has no most frequent value")
    top = max(totals.values())
    return min(v for v, c in totals.items() if c == top)


#: The float formats a bisection may run over: struct codes of the float and of the same-width integer, the
#: magnitude mask, the sign bit and the largest finite value.
_FORMATS = {
    64: ("<d", "<q", 0x7FFF_FFFF_FFFF_FFFF, -0x8000_0000_0000_0000, float(np.finfo(np.float64).max)),
    32: ("<f", "<i", 0x7FFF_FFFF, -0x8000_0000, float(np.finfo(np.float32).max)),
}


def _order_key(value: float, width: int = 64) -> int:
    """An integer that orders like the float (IEEE-754 bits of ``width``, negatives reflected): bisection on
    it ends on a float of that width exactly."""
    real, whole, mask, _, _ = _FORMATS[width]
    bits = struct.unpack(whole, struct.pack(real, value))[0]
    return bits if bits >= 0 else -(bits & mask) - 1


def _from_order_key(key: int, width: int = 64) -> float:
    real, whole, _, sign, _ = _FORMATS[width]
    bits = key if key >= 0 else (-key - 1) | sign
    return struct.unpack(real, struct.pack(whole, bits))[0]


def order_statistic_search(k: int, width: int = 64) -> Generator[float, int, float]:
    """The bisection of :func:`federated_order_statistic` as a generator: it yields each threshold t, is sent
    back how many present values of all clients are <= t, and returns the k-th smallest present value (k
    from 0). A server asking many columns at once runs one per column in lockstep, one exchange per step.
    ``width = 32`` bisects over the finite float32 values only: exact, in at most 32 steps, when every value
    is a float32 (a table's features are kept as float32)."""
    _, _, _, _, largest = _FORMATS[width]
    low, high = _order_key(-largest, width), _order_key(largest, width)
    while low < high:
        middle = (low + high) // 2
        if (yield _from_order_key(middle, width)) >= k + 1:
            high = middle
        else:
            low = middle + 1
    return _from_order_key(low, width)


def federated_order_statistic(k: int, count_at_most: Callable[[float], int]) -> float:
    """The k-th smallest present value (k from 0) over all clients, from counts alone.

    ``count_at_most(t)`` is the sum of the clients' answers :func:`client_count_at_most` to threshold t. The
    server bisects on the floats' order (:func:`_order_key`) over every finite float64, so it never asks a
    client for a value or a range, and ends on the exact value after at most 64 questions: the smallest t
    with at least k + 1 values <= t is a value some client holds.
    """
    search = order_statistic_search(k)
    try:
        threshold = next(search)
        while True:
            threshold = search.send(count_at_most(threshold))
    except StopIteration as done:
        return float(done.value)


def median_ranks(count: int) -> tuple[int, ...]:
    """The ranks (from 0) of the middle value(s) of ``count`` present values: one when odd, two when even."""
    return ((count - 1) // 2,) if count % 2 else ((count - 1) // 2, count // 2)


def median_of(middle: Sequence[float]) -> float:
    """The median from the middle value(s) :func:`median_ranks` names: the value, or the mean of the two (as
    numpy's median)."""
    return middle[0] if len(middle) == 1 else (middle[0] + middle[1]) / 2


def federated_median(sites: Sequence[np.ndarray]) -> float:
    """The exact median of one column's present values over all clients (``sites``: each client's column,
    NaN = missing), through the clients' reports only: their counts of present values, then
    :func:`federated_order_statistic` for the middle one or two (the mean of the two middle values when
    the count is even, as numpy's median)."""
    count = sum(client_present_sum(values).count for values in sites)
    if count == 0:
        raise DataError("no client reported a present value: the column has no median")

    def count_at_most(threshold: float) -> int:
        return sum(client_count_at_most(values, threshold) for values in sites)

    return median_of([federated_order_statistic(k, count_at_most) for k in median_ranks(count)])


def federated_fill_value(sites: Sequence[np.ndarray], strategy: str) -> float:
    """The fill value of one numeric column under ``strategy`` (one of :data:`IMPUTE_STRATEGIES`), from what
    each client (``sites``: its rows' values of the column, NaN = missing) reports."""
    if strategy == "mean":
        return federated_mean([client_present_sum(values) for values in sites])
    if strategy == "most_frequent":
        return federated_most_frequent([client_value_counts(values) for values in sites])
    if strategy == "median":
        return federated_median(sites)
    raise ValueError(f"unknown imputation strategy {strategy!r}; accepted: {list(IMPUTE_STRATEGIES)}")
