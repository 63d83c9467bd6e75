"""Tables: CSV and Parquet files and data frames read as columns, then encoded as float features.

A table is a mapping column name -> values. :func:`encode_table` turns a train and a test table into
float32 features (N, F): numeric columns as they are (no quantisation), categorical columns one-hot over
their vocabulary, the label column into class indices 0..K-1, and an optional client column into each
training row's site (the natural cross-silo layout: one hospital, one site).

Choices, stated once here and in docs/your-own-data.md:
- A column is numeric when every training value parses as a number; otherwise (or when listed in
  ``categorical``) it is categorical.
- A cell is missing when it is empty or one of the usual markers (:data:`MISSING_MARKERS`: NA, N/A, NaN,
  null, None, ?, -, in any case), in every route (CSV, Parquet, data frame).
- Missing or non-finite numeric values are refused, naming every such column with its rows and counts per
  site, unless the caller imputes (``keep_missing``: missing numbers stay NaN for the federated imputation
  of ``fedhet.data.datasets.imputation``; inf is refused still). A column mostly of numbers with a few
  other values is refused too (naming the values and rows), never silently one-hot encoded; list it in
  ``categorical`` if it is a category.
  A missing categorical value is its own category, ``(missing)``; a categorical column with more levels
  than a tenth of its rows (and more than 10) is warned about (an identifier, or numbers read as text).
- A categorical column's vocabulary is the sorted union of the category sets each site's training rows
  hold (one set when the table names no sites): what the clients would report, never their rows. A test
  category outside it encodes as all zeros.
- Classes are the sorted distinct label values of train and test together, numbered 0..K-1 in that order,
  so labels {0, 5, 9} make three classes named "0", "5", "9". A class only the test rows hold is refused.
"""

from __future__ import annotations

import csv
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.errors import DataError

#: The category a missing categorical value (empty cell, None, NaN) becomes.
MISSING_CATEGORY = "(missing)"
#: Cell texts read as a missing value (after stripping and lower-casing): the markers tables use for one.
MISSING_MARKERS = frozenset({"", "na", "n/a", "nan", "null", "none", "?", "-"})
#: A column whose present values are more than this share numbers is a numeric column with bad cells.
MOSTLY_NUMBERS = 0.5

log = logging.getLogger("fedhet")

Columns = dict[str, np.ndarray]


@dataclass(frozen=True, eq=False)
class EncodedTable:
    """A train/test pair of encoded tables: each split's float32 features and int64 labels (and each training
    row's site, an index into ``sites``, or None), then the names of the classes, features and sites."""

    train_x: np.ndarray
    train_y: np.ndarray
    train_sites: np.ndarray | None
    test_x: np.ndarray
    test_y: np.ndarray
    classes: tuple[str, ...]
    feature_names: tuple[str, ...]
    numeric: tuple[bool, ...]  # which features are standardised (numeric), not one-hot
    sites: tuple[str, ...]


# --------------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------------
def read_csv(path: str | os.PathLike) -> Columns:
    """A CSV file with a header row, as columns of strings (types are decided by :func:`encode_table`)."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataError(f"{path}: cannot read it as a CSV file ({type(err).__name__}: {err})") from err
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise DataError(f"{path}: empty; a CSV table starts with a header row naming its columns")
    header = [name.strip() for name in rows[0]]
    _check_header(header, str(path))
    body = [row for row in rows[1:] if any(cell.strip() for cell in row)]  # blank lines are not rows
    for row in body:
        if len(row) != len(header):
            raise DataError(
                f"{path}: a row has {len(row)} cells but the header names {len(header)} columns (first such "
                f"row: {row[:6]}{' …' if len(row) > 6 else ''}); fix the quoting or the delimiter (',')"
            )
    return {name: np.array([row[i].strip() for row in body], dtype=object) for i, name in enumerate(header)}


def read_parquet(path: str | os.PathLike) -> Columns:
    """A Parquet file's columns (needs pyarrow)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise DataError(
            f"{path}: reading Parquet needs pyarrow; pip install 'fedhet[tables]' (or pyarrow), or save the "
            "table as CSV"
        ) from err
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises its own error types for corrupt files
        raise DataError(f"{path}: cannot read it as a Parquet file ({type(err).__name__}: {err})") from err
    return {name: _column_values(table.column(name).to_pylist()) for name in table.column_names}


def columns_from(table: Any, source: str) -> Columns:
    """Columns from a pandas DataFrame or a mapping of name -> sequence (all of one length)."""
    if hasattr(table, "columns") and hasattr(table, "__getitem__") and not isinstance(table, Mapping):
        names = [str(c) for c in table.columns]
        columns = {str(c): _frame_column(table[c]) for c in table.columns}
    elif isinstance(table, Mapping):
        names = [str(c) for c in table]
        columns = {
            str(c): _column_values(list(v) if not isinstance(v, np.ndarray) else v) for c, v in table.items()
        }
    else:
        raise DataError(
            f"{source}: expected a pandas DataFrame or a mapping column -> values, got {type(table).__name__}"
        )
    _check_header(names, source)
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise DataError(f"{source}: columns differ in length: {lengths}")
    return columns


def _frame_column(series: Any) -> np.ndarray:
    kind = getattr(getattr(series, "dtype", None), "kind", "O")
    if kind in "biuf":
        return np.asarray(series.to_numpy(), dtype=np.float64)
    return _column_values(list(series.to_numpy()))


def _column_values(values: Sequence[Any] | np.ndarray) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind in "biuf":
        return array.astype(np.float64)
    return np.array(list(values), dtype=object)


def _check_header(names: Sequence[str], source: str) -> None:
    blank = [i for i, name in enumerate(names) if not str(name).strip()]
    if blank:
        raise DataError(f"{source}: column {blank[0] + 1} has no name; every column needs a header")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DataError(f"{source}: two columns are named {name!r}; rename one")
        seen.add(name)


# --------------------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------------------
def _is_missing(value: Any) -> bool:
    return (
        value is None
        or (isinstance(value, float) and math.isnan(value))
        or (isinstance(value, str) and value.strip().lower() in MISSING_MARKERS)
    )


def _not_numbers(values: np.ndarray) -> list[int]:
    """The rows whose present value does not parse as a number (a bool is not a number here)."""
    bad = []
    for i, value in enumerate(values):
        if _is_missing(value):
            continue
        if isinstance(value, bool):
            bad.append(i)
            continue
        try:
            float(value)
        except (TypeError, ValueError):
            bad.append(i)
    return bad


def _rows_text(rows: Sequence[int] | np.ndarray, sites: np.ndarray | None, site_names: Sequence[str]) -> str:
    shown = ", ".join(str(int(i)) for i in rows[:5]) + (" …" if len(rows) > 5 else "")
    text = f"rows {shown}"
    if sites is not None:
        per_site = np.bincount(sites[np.asarray(rows, dtype=np.int64)], minlength=len(site_names))
        text += "; per site: " + ", ".join(f"{site_names[s]} {n}" for s, n in enumerate(per_site) if n)
    return text


def _as_numbers(values: np.ndarray) -> np.ndarray | None:
    """The column as float64, or None when some present value is not a number (a categorical column).

    Missing values become NaN (refused later, naming the rows)."""
    if values.dtype.kind in "biuf":
        return values.astype(np.float64)
    out = np.empty(len(values), dtype=np.float64)
    for i, value in enumerate(values):
        if _is_missing(value):
            out[i] = np.nan
            continue
        if isinstance(value, bool):
            return None
        try:
            out[i] = float(value)
        except (TypeError, ValueError):
            return None
    return out


def _categories(values: np.ndarray) -> np.ndarray:
    """Category labels as strings; missing ones are :data:`MISSING_CATEGORY`."""
    out = []
    for value in values:
        if _is_missing(value):
            out.append(MISSING_CATEGORY)
        elif isinstance(value, float) and value.is_integer():
            out.append(str(int(value)))  # 1.0 read from a number column names category "1"
        else:
            out.append(str(value))
    return np.array(out, dtype=object)


def many_levels(levels: int, rows: int) -> bool:
    """Whether a categorical column has more levels than a tenth of its rows (and more than 10): warned about,
    as an identifier or numbers read as text."""
    return levels > max(10, rows // 10)


def _missing_numbers(
    name: str,
    values: np.ndarray,
    part: str,
    sites: np.ndarray | None,
    site_names: Sequence[str],
    keep_missing: bool = False,
) -> str | None:
    """What is wrong with a numeric column's ``part`` (train or test): its missing or non-finite values (only
    the non-finite ones, inf, when missing values are kept for imputation)."""
    bad_mask = ~np.isfinite(values)
    if keep_missing:
        bad_mask &= ~np.isnan(values)
    bad = np.flatnonzero(bad_mask)
    if not bad.size:
        return None
    where = _rows_text(bad, sites, site_names)
    what = "infinite" if keep_missing else "missing or non-finite"
    return f"column {name!r} has {bad.size} {what} value(s) in {part} ({where})"


def _label_classes(train: np.ndarray, test: np.ndarray, name: str, source: str) -> tuple[str, ...]:
    both = np.concatenate([train, test])
    missing = [i for i, v in enumerate(both) if _is_missing(v)]
    if missing:
        raise DataError(
            f"{source}: the label column {name!r} is empty or missing in {len(missing)} row(s); every row "
            "needs a class"
        )
    numbers = _as_numbers(both)
    if numbers is not None and np.all(np.isfinite(numbers)) and np.all(numbers == np.round(numbers)):
        return tuple(str(int(v)) for v in np.unique(numbers))
    return tuple(sorted({str(v) for v in both}))


def _refuse_unseen_classes(
    train: np.ndarray, test: np.ndarray, classes: tuple[str, ...], name: str, source: str
) -> None:
    """A class only the test rows hold: no client can learn it, and it would be a silent extra class that
    every metric counts as missed. Refused, naming the values and rows."""
    seen = set(_label_indices(train, classes).tolist())
    test_idx = _label_indices(test, classes)
    unseen = sorted({int(i) for i in test_idx} - seen)
    if unseen:
        rows = np.flatnonzero(np.isin(test_idx, unseen))
        shown = ", ".join(str(int(i)) for i in rows[:5]) + (" …" if rows.size > 5 else "")
        raise DataError(
            f"{source}: the test rows hold class(es) {[classes[i] for i in unseen]} of {name!r} that no "
            f"training row holds (test rows {shown}, from 0 after the header): no client can learn them; "
            "drop those test rows, or add training rows of those classes"
        )


def _label_indices(values: np.ndarray, classes: tuple[str, ...]) -> np.ndarray:
    index = {name: i for i, name in enumerate(classes)}
    numbers = _as_numbers(values) if all(c.lstrip("-").isdigit() for c in classes) else None
    keys = [str(int(v)) for v in numbers] if numbers is not None else [str(v) for v in values]
    return np.array([index[k] for k in keys], dtype=np.int64)


def _mostly_numbers(
    name: str, train: np.ndarray, test: np.ndarray, sites: np.ndarray | None, site_names: Sequence[str]
) -> list[str]:
    """A column whose present values are mostly numbers but not all: the values that are not, never read
    silently as categories (empty when the column is a column of categories)."""
    out = []
    for part, values in (("train", train), ("test", test)):
        present = sum(not _is_missing(v) for v in values)
        bad = _not_numbers(values)
        if bad and present and (present - len(bad)) / present > MOSTLY_NUMBERS:
            shown = sorted({str(values[i]) for i in bad})[:5]
            where = _rows_text(bad, sites if part == "train" else None, site_names)
            out.append(f"column {name!r} is numbers but for {len(bad)} value(s) {shown} in {part} ({where})")
    return out


def encode_table(
    train: Columns,
    test: Columns,
    *,
    label: str,
    client: str | None = None,
    categorical: Sequence[str] = (),
    source: str = "table",
    keep_missing: bool = False,
) -> EncodedTable:
    """Encode a train and a test table (see the module docstring for every choice made). ``keep_missing``:
    missing numeric cells stay NaN (for an imputation that follows) instead of being refused."""
    for part, table in (("train", train), ("test", test)):
        if label not in table:
            raise DataError(
                f"{source}: no label column {label!r} in the {part} table (columns: {list(table)[:12]}); "
                "name it with data.label_column (fedhet.data.from_table(label=...))"
            )
    if client is not None and client not in train:
        raise DataError(
            f"{source}: no client column {client!r} in the train table (columns: {list(train)[:12]}); fix "
            "data.client_column, or leave it unset to split the rows with data.split"
        )
    unknown = [c for c in categorical if c not in train]
    if unknown:
        raise DataError(
            f"{source}: categorical column(s) {unknown} not in the table (columns: {list(train)})"
        )
    features = [c for c in train if c not in (label, client)]
    if not features:
        raise DataError(f"{source}: the table has no feature columns besides the label {label!r}")
    absent = [c for c in features if c not in test]
    if absent:
        raise DataError(
            f"{source}: the test table lacks feature column(s) {absent}; give it the train columns"
        )
    n_train = len(train[label])
    if n_train == 0:
        raise DataError(f"{source}: the train table has no rows")

    sites: tuple[str, ...] = ()
    train_sites = None
    if client is not None:
        names = _categories(train[client])
        sites = tuple(sorted(set(names.tolist())))
        lookup = {s: i for i, s in enumerate(sites)}
        train_sites = np.array([lookup[s] for s in names], dtype=np.int64)

    blocks_train, blocks_test, names_out, numeric = [], [], [], []
    problems: list[str] = []  # every column at fault, refused together below
    for name in features:
        numbers = None if name in categorical else _as_numbers(train[name])
        test_numbers = None if numbers is None else _as_numbers(test[name])
        if name not in categorical and (numbers is None or test_numbers is None):
            problems += _mostly_numbers(name, train[name], test[name], train_sites, sites)
        if numbers is not None and test_numbers is not None:
            problems += filter(None, [
                _missing_numbers(name, numbers, "train", train_sites, sites, keep_missing),
                _missing_numbers(name, test_numbers, "test", None, sites, keep_missing),
            ])  # fmt: skip
            blocks_train.append(numbers[:, None])
            blocks_test.append(test_numbers[:, None])
            names_out.append(name)
            numeric.append(True)
            continue
        train_cats, test_cats = _categories(train[name]), _categories(test[name])
        if train_sites is None:
            site_sets = [set(train_cats.tolist())]
        else:  # what each client reports: the set of categories its rows hold
            site_sets = [set(train_cats[train_sites == s].tolist()) for s in range(len(sites))]
        vocabulary = sorted(set().union(*site_sets))
        blocks_train.append(
            (train_cats[:, None] == np.array(vocabulary, dtype=object)[None]).astype(np.float64)
        )
        blocks_test.append(
            (test_cats[:, None] == np.array(vocabulary, dtype=object)[None]).astype(np.float64)
        )
        names_out.extend(f"{name}={value}" for value in vocabulary)
        numeric.extend([False] * len(vocabulary))
        if many_levels(len(vocabulary), n_train):
            log.warning(
                "%s: categorical column %r has %d levels over %d training rows, one-hot encoded into as many "
                "features: an identifier (drop it) or numbers read as text?",
                source, name, len(vocabulary), n_train,
            )  # fmt: skip
    if problems:
        raise DataError(
            f"{source}: {'; '.join(problems)} (rows count from 0 after the header; for a folder of site "
            "files, over the files in name order); fedhet does not impute unless asked: set "
            "data.impute = 'mean', 'median' or 'most_frequent' (fedhet.data.from_table(impute=...)), or fill "
            "them or drop those rows before federating (inf is never imputed), and list a column of "
            "categories in data.categorical_columns"
        )

    classes = _label_classes(train[label], test[label], label, source)
    _refuse_unseen_classes(train[label], test[label], classes, label, source)
    return EncodedTable(
        train_x=np.ascontiguousarray(np.concatenate(blocks_train, axis=1), dtype=np.float32),
        train_y=_label_indices(train[label], classes),
        test_x=np.ascontiguousarray(np.concatenate(blocks_test, axis=1), dtype=np.float32),
        test_y=_label_indices(test[label], classes),
        classes=classes,
        feature_names=tuple(names_out),
        numeric=tuple(numeric),
        train_sites=train_sites,
        sites=sites,
    )


def concat_tables(tables: Sequence[Columns], source: str) -> Columns:
    """Row-wise union of tables with the same columns (per-client files into one table)."""
    names = list(tables[0])
    for table in tables[1:]:
        if set(table) != set(names):
            raise DataError(
                f"{source}: the files' columns differ ({sorted(set(names) ^ set(table))} not in all); give "
                "every client's file the same header"
            )
    return {name: np.concatenate([np.asarray(t[name], dtype=object) for t in tables]) for name in names}
