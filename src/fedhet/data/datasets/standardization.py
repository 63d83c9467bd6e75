"""Federated standardisation of a table's features: what each client reports, and what the server makes
of the reports.

Each client reports, for its own rows, the count, the per-feature sum and sum of squares
(:func:`client_feature_statistics` — never a row), and the server combines them into per-feature mean and
std (:func:`combine_feature_statistics`). The statistics are self-reported: a client that lies shifts every
client's inputs. One-hot columns are not standardised (mean 0, std 1).
"""

from __future__ import annotations

from collections.abc import Sequence
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
