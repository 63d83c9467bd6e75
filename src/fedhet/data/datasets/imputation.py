"""Federated imputation of a table's missing numbers (``data.impute``, ``data.missing_indicator``).

Applied to an encoded table whose missing numeric cells are NaN (``encode_table(keep_missing=True)``): each
numeric column with a missing cell in the train or the test rows gets one fill value, computed from what the
sites report on their training rows (``fedhet.data.datasets.standardization``: counts and sums for the mean,
value counts for the most frequent value, counts of values <= a threshold for the exact median), never from
pooled rows, and applied to the train and the test rows alike. With ``missing_indicator`` every column with a
missing training cell gains a 0/1 feature ``<column>=missing`` right after it (not standardised, like a
one-hot column). Missing categorical cells are their own category already and are left alone.

The sites are the table's own (a folder's files, a client column); a table that names none is one report,
which gives the same fill value (each statistic is exact, whatever the grouping). The rows the server later
holds out for validation (``data.validation_fraction``) are training rows here and count in the fill value.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from fedhet.data.datasets.standardization import IMPUTE_STRATEGIES, federated_fill_value
from fedhet.data.formats.tables import EncodedTable
from fedhet.errors import ConfigError, DataError

log = logging.getLogger("fedhet")

#: The suffix of a missing-indicator feature's name: ``<column>=missing``.
INDICATOR_SUFFIX = "=missing"


@dataclass(frozen=True)
class Imputed:
    """One imputed column: its fill value, the missing cells per site (training rows) and in the test rows."""

    column: str
    fill_value: float
    train_cells: dict[str, int]
    test_cells: int
    indicator: bool


def log_imputed(item: Imputed, strategy: str, source: str) -> None:
    """The line a run prints for one imputed column (a warning: the run's data are not the files' cells)."""
    per_site = ", ".join(f"{site} {n}" for site, n in item.train_cells.items())
    log.warning(
        "%s: imputed column %r with the %s of the sites' training rows, %.6g: missing cells per "
        "site: %s; test rows %d%s",
        source, item.column, strategy.replace("_", " "), item.fill_value, per_site, item.test_cells,
        f"; indicator feature {item.column + INDICATOR_SUFFIX!r} added" if item.indicator else "",
    )  # fmt: skip


def check_impute_options(impute: str | None, missing_indicator: bool) -> None:
    """Refuse an unknown strategy, or an indicator asked for without imputation (the error names the fix)."""
    if impute is not None and impute not in IMPUTE_STRATEGIES:
        raise ConfigError(
            f"impute={impute!r} is not accepted; choose one of {list(IMPUTE_STRATEGIES)}, or None (the "
            "default) to refuse missing numbers"
        )
    if not isinstance(missing_indicator, bool):
        raise ConfigError(f"missing_indicator={missing_indicator!r} must be true or false")
    if missing_indicator and impute is None:
        raise ConfigError(
            "missing_indicator = true marks imputed cells, but impute is not set (missing numbers are "
            f"refused): set impute to one of {list(IMPUTE_STRATEGIES)}, or drop missing_indicator"
        )


def impute_table(
    encoded: EncodedTable, strategy: str, missing_indicator: bool = False, source: str = "table"
) -> tuple[EncodedTable, list[Imputed]]:
    """Fill every missing numeric cell of ``encoded`` with its column's federated ``strategy`` value (train
    and test rows), adding the indicator features if asked; returns the table and what was imputed (also
    logged)."""
    check_impute_options(strategy, missing_indicator)
    train_x = encoded.train_x.astype(np.float64)
    test_x = encoded.test_x.astype(np.float64)
    if encoded.train_sites is None:
        site_rows = [np.arange(len(train_x))]
        site_names: tuple[str, ...] = ("train",)
    else:
        site_rows = [np.flatnonzero(encoded.train_sites == s) for s in range(len(encoded.sites))]
        site_names = encoded.sites
    train_cols, test_cols, names, numeric = [], [], [], []
    done: list[Imputed] = []
    for j, (name, is_numeric) in enumerate(zip(encoded.feature_names, encoded.numeric, strict=True)):
        train_col, test_col = train_x[:, j], test_x[:, j]
        train_missing, test_missing = np.isnan(train_col), np.isnan(test_col)
        train_cols.append(train_col)
        test_cols.append(test_col)
        names.append(name)
        numeric.append(is_numeric)
        if not is_numeric or not (train_missing.any() or test_missing.any()):
            continue
        sites = [train_col[rows] for rows in site_rows]  # what each site reports on is its own rows only
        if train_missing.all():
            raise DataError(
                f"{source}: column {name!r} has no present value in any site's training rows: there is "
                "nothing to impute it from; drop the column, or fill it before federating"
            )
        fill = federated_fill_value(sites, strategy)
        train_cols[-1] = np.where(train_missing, fill, train_col)
        test_cols[-1] = np.where(test_missing, fill, test_col)
        indicator = missing_indicator and bool(train_missing.any())
        if indicator:
            train_cols.append(train_missing.astype(np.float64))
            test_cols.append(test_missing.astype(np.float64))
            names.append(name + INDICATOR_SUFFIX)
            numeric.append(False)
        cells = {site: int(np.count_nonzero(np.isnan(v))) for site, v in zip(site_names, sites, strict=True)}
        done.append(Imputed(name, float(np.float32(fill)), cells, int(test_missing.sum()), indicator))
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise DataError(
            f"{source}: the missing indicator of a column makes feature name(s) {clash} twice; rename the "
            "column whose level is named so, or drop data.missing_indicator"
        )
    for item in done:
        log_imputed(item, strategy, source)
    imputed = replace(
        encoded,
        train_x=np.ascontiguousarray(np.stack(train_cols, axis=1), dtype=np.float32),
        test_x=np.ascontiguousarray(np.stack(test_cols, axis=1), dtype=np.float32),
        feature_names=tuple(names),
        numeric=tuple(numeric),
    )
    return imputed, done
