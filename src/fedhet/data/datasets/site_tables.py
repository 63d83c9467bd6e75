"""A site's own table at a deployment node: what the node reports about it, how the server combines the
reports into the run's encoding, and how the node then encodes its rows.

A node reads one CSV or Parquet file (its rows only). It reports (:func:`site_report`, never a row): its
row count, which feature columns are numbers, per numeric column the sum and sum of squares of its values
(as float32, the precision the features are kept in), the level set of every categorical column and the
set of its label values. The server (:func:`combine_site_reports`) makes of them what the embedded
engine's ``encode_table`` and federated standardisation compute on the same rows:

- the feature columns in the order of the lowest client id's file; a categorical column one-hot over the
  sorted union of the sites' level sets; numeric columns as they are;
- the classes: the sorted distinct label values of the sites and of the server's test rows (or the
  named data set's own classes, for scikit-learn's tables);
- per-feature mean and std from the reports, summed in client-id order
  (``fedhet.data.datasets.standardization``).

With ``data.impute``, missing numbers are filled with the federation's fill values, which the server works
out with the nodes (``fedhet.data.datasets.site_imputation``) before the standardisation's sums.

Refused, naming the column and the fix: a column numeric at one site and not at another (list it in
``data.categorical_columns``), missing numbers without ``data.impute``, sites whose columns differ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.data.datasets.imputation import INDICATOR_SUFFIX
from fedhet.data.datasets.site_imputation import ImputationPlan, present_values
from fedhet.data.datasets.standardization import (
    FeatureStatistics,
    client_feature_statistics,
    client_present_sum,
    combine_feature_statistics,
)
from fedhet.data.formats import tables
from fedhet.errors import DataError

#: scikit-learn's tables fedhet names (``fedhet.data.datasets.tables.load_sklearn_table``).
SKLEARN_TABLES = ("wine", "breast-cancer")
TABLE_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def read_table_file(path: str | os.PathLike) -> tables.Columns:
    """One CSV or Parquet file's columns."""
    path = Path(path).expanduser()
    kind = TABLE_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{path}: not a table file; give a .csv or .parquet file (node config data-path)")
    if not path.is_file():
        raise DataError(f"{path}: no such file (node config data-path; looked at {path.resolve()})")
    return tables.read_csv(path) if kind == "csv" else tables.read_parquet(path)


def _features(columns: Mapping[str, Any], label: str, client: str | None, source: str) -> list[str]:
    if label not in columns:
        raise DataError(
            f"{source}: no label column {label!r} (columns: {list(columns)[:12]}); the run's "
            "data.label_column names it"
        )
    features = [c for c in columns if c not in (label, client)]
    if not features:
        raise DataError(f"{source}: the table has no feature columns besides the label {label!r}")
    return features


def _site_columns(
    columns: Mapping[str, np.ndarray],
    *,
    label: str,
    client: str | None,
    categorical: Sequence[str],
    source: str,
    keep_missing: bool,
) -> tuple[list[str], dict[str, np.ndarray], dict[str, list[str]]]:
    """A site's feature columns, its numeric ones as float64 (NaN = missing, refused unless
    ``keep_missing``) and its categorical ones' level sets."""
    features = _features(columns, label, client, source)
    numbers_of, levels, problems = {}, {}, []
    for name in features:
        values = np.asarray(columns[name])
        numbers = None if name in categorical else tables._as_numbers(values)
        if numbers is None:
            if name not in categorical:
                problems += tables._mostly_numbers(name, values, np.array([], dtype=object), None, ())
            levels[name] = sorted(set(tables._categories(values).tolist()))
            continue
        problem = tables._missing_numbers(name, numbers, "this site's rows", None, (), keep_missing)
        if problem:
            problems.append(problem)
        numbers_of[name] = numbers
    if problems:
        fix = (
            "fill them or drop those rows (inf is never imputed)"
            if keep_missing
            else "set data.impute = 'mean', 'median' or 'most_frequent' to fill them, or fill them or drop "
            "those rows"
        )
        raise DataError(
            f"{source}: {'; '.join(problems)} (rows count from 0 after the header): {fix}, and list a column "
            "of categories in data.categorical_columns"
        )
    return features, numbers_of, levels


def site_numeric_values(
    columns: Mapping[str, np.ndarray],
    *,
    label: str,
    client: str | None = None,
    categorical: Sequence[str] = (),
    source: str = "site table",
) -> dict[str, np.ndarray]:
    """A site's numeric columns as the run keeps them (float32 values as float64; NaN = missing): what a
    node answers the server's imputation queries from (``fedhet.data.datasets.site_imputation``)."""
    _, numbers_of, _ = _site_columns(
        columns, label=label, client=client, categorical=categorical, source=source, keep_missing=True
    )
    return {name: present_values(numbers) for name, numbers in numbers_of.items()}


def site_report(
    columns: Mapping[str, np.ndarray],
    *,
    label: str,
    client: str | None = None,
    categorical: Sequence[str] = (),
    source: str = "site table",
    impute: str | None = None,
    fills: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """What a node tells the server about its own table (JSON values; no row leaves the node).

    Missing numbers are refused unless ``impute`` names a strategy: the report then also holds, per numeric
    column, its missing cells (``missing``) and the sum of its present values (``present_sum``); its sums
    for the standardisation count only once ``fills`` (the server's fill values, by column) fill the cells."""
    features, numbers_of, levels = _site_columns(
        columns, label=label, client=client, categorical=categorical, source=source,
        keep_missing=impute is not None,
    )  # fmt: skip
    labels = np.asarray(columns[label])
    missing = [i for i, v in enumerate(labels) if tables._is_missing(v)]
    if missing:
        raise DataError(
            f"{source}: the label column {label!r} is empty in rows {missing[:5]}; every row needs a class"
        )
    rows = len(labels)
    numeric = [name for name in features if name in numbers_of]
    report: dict[str, Any] = {"rows": rows, "columns": features, "numeric": numeric}
    if impute is not None:
        values = {name: present_values(numbers_of[name]) for name in numeric}
        report["missing"] = {name: int(np.count_nonzero(np.isnan(values[name]))) for name in numeric}
        report["present_sum"] = {name: client_present_sum(values[name]).total for name in numeric}
    blocks = []
    for name in numeric:
        numbers = numbers_of[name]
        if fills and name in fills:
            numbers = np.where(np.isnan(numbers), float(fills[name]), numbers)
        blocks.append(numbers[:, None])
    # float32, as the features are kept, in one (N, F) block as the embedded engine sums them
    block = np.concatenate(blocks, axis=1).astype(np.float32) if blocks else np.zeros((rows, 0), np.float32)
    stats = client_feature_statistics(block)
    report.update(
        {
            "sum": [float(v) for v in stats.total],
            "sum_sq": [float(v) for v in stats.total_sq],
            "levels": levels,
            "labels": {
                str(v): int(n)
                for v, n in zip(*np.unique(labels.astype(str), return_counts=True), strict=True)
            },
        }
    )
    return report


@dataclass(frozen=True)
class TableEncoding:
    """How every node encodes its rows: the label column, the feature columns in order, each categorical
    column's vocabulary (the others are numeric) and the classes."""

    label: str
    columns: tuple[str, ...]
    vocabularies: Mapping[str, tuple[str, ...]]
    classes: tuple[str, ...]
    #: data.impute's fill value of each numeric column to fill, and the columns with a missing indicator
    fills: Mapping[str, float] = field(default_factory=dict)
    indicators: tuple[str, ...] = ()

    @property
    def feature_names(self) -> tuple[str, ...]:
        out: list[str] = []
        for name in self.columns:
            vocab = self.vocabularies.get(name)
            out.extend([name] if vocab is None else [f"{name}={v}" for v in vocab])
            if name in self.indicators:
                out.append(name + INDICATOR_SUFFIX)
        return tuple(out)

    @property
    def numeric(self) -> tuple[bool, ...]:
        out: list[bool] = []
        for name in self.columns:
            vocab = self.vocabularies.get(name)
            out.extend([True] if vocab is None else [False] * len(vocab))
            if name in self.indicators:
                out.append(False)  # a 0/1 indicator is not standardised, as a one-hot column
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "columns": list(self.columns),
            "vocabularies": {k: list(v) for k, v in self.vocabularies.items()},
            "classes": list(self.classes),
            "fills": dict(self.fills),
            "indicators": list(self.indicators),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableEncoding:
        return cls(
            label=str(data["label"]),
            columns=tuple(data["columns"]),
            vocabularies={k: tuple(v) for k, v in data["vocabularies"].items()},
            classes=tuple(data["classes"]),
            fills={k: float(v) for k, v in data.get("fills", {}).items()},
            indicators=tuple(data.get("indicators", ())),
        )


def encode_rows(
    columns: Mapping[str, np.ndarray], encoding: TableEncoding, source: str
) -> tuple[np.ndarray, np.ndarray]:
    """A table's rows as float32 features (N, F) and int64 labels, with the run's encoding (as
    ``encode_table`` does: numbers as they are, categories one-hot, a level outside the vocabulary zeros)."""
    absent = [c for c in (*encoding.columns, encoding.label) if c not in columns]
    if absent:
        raise DataError(f"{source}: no column(s) {absent}; the run's table has {list(encoding.columns)}")
    blocks = []
    for name in encoding.columns:
        vocab = encoding.vocabularies.get(name)
        if vocab is not None:
            cats = tables._categories(np.asarray(columns[name]))
            blocks.append((cats[:, None] == np.array(vocab, dtype=object)[None]).astype(np.float64))
            continue
        numbers = tables._as_numbers(np.asarray(columns[name]))
        missing = None if numbers is None or name not in encoding.fills else np.isnan(numbers)
        if missing is not None:  # filled with the federation's value, as the embedded engine fills
            numbers = np.where(missing, encoding.fills[name], numbers)
        if numbers is None or not np.all(np.isfinite(numbers)):
            raise DataError(
                f"{source}: column {name!r} holds values that are not numbers, or missing ones; the run "
                "reads it as a numeric column"
                + ("" if encoding.fills else " (set data.impute to fill missing ones)")
            )
        blocks.append(numbers[:, None])
        if name in encoding.indicators:
            blocks.append((missing if missing is not None else np.zeros(len(numbers), bool))[:, None] * 1.0)
    x = np.ascontiguousarray(np.concatenate(blocks, axis=1), dtype=np.float32)
    try:
        y = tables._label_indices(np.asarray(columns[encoding.label]), encoding.classes)
    except (KeyError, TypeError, ValueError) as err:
        raise DataError(
            f"{source}: label value {err} of column {encoding.label!r} is not one of the run's classes "
            f"{list(encoding.classes)}"
        ) from err
    return x, y


def combine_site_reports(
    reports: Mapping[int, Mapping[str, Any]],
    test: Mapping[str, np.ndarray],
    *,
    label: str,
    classes: Sequence[str] | None = None,
    source: str = "the sites' tables",
    imputation: ImputationPlan | None = None,
) -> tuple[TableEncoding, tuple[float, ...], tuple[float, ...]]:
    """The run's encoding and per-feature mean and std from the nodes' reports (by client id) and the
    server's test rows; ``classes`` fixes the classes (a named data set's), else they are the sorted
    distinct label values of the sites and the test rows, as ``encode_table`` makes them. ``imputation``:
    the fill values and indicators of ``data.impute`` (the reports' sums then count the filled cells)."""
    if not reports:
        raise DataError(f"{source}: no node reported its table")
    first = min(reports)
    order = list(reports[first]["columns"])
    for cid, report in sorted(reports.items()):
        if set(report["columns"]) != set(order):
            diff = sorted(set(report["columns"]) ^ set(order))
            raise DataError(
                f"{source}: client {cid}'s table and client {first}'s differ in column(s) {diff}; give every "
                "site's file the same header"
            )
    categorical = {c for r in reports.values() for c in r["levels"]}
    numeric_somewhere = {c for r in reports.values() for c in r["numeric"]}
    mixed = sorted(categorical & numeric_somewhere)
    if mixed:
        where = {c: sorted(cid for cid, r in reports.items() if c in r["levels"]) for c in mixed}
        raise DataError(
            f"{source}: column(s) {mixed} are numbers at some sites and not at others (not numbers at "
            f"clients {where}); list them in data.categorical_columns, or fix the cells that are not numbers"
        )
    absent = [c for c in (*order, label) if c not in test]
    if absent:
        raise DataError(f"{source}: the server's test table lacks column(s) {absent}")
    for name in order:
        if name not in categorical and tables._as_numbers(np.asarray(test[name])) is None:
            raise DataError(
                f"{source}: column {name!r} is numbers at every site but not in the server's test table; "
                "fix the test rows or list it in data.categorical_columns"
            )
    vocabularies = {
        c: tuple(sorted({v for r in reports.values() for v in r["levels"].get(c, ())}))
        for c in order
        if c in categorical
    }
    site_labels = np.array(sorted({v for r in reports.values() for v in r["labels"]}), dtype=object)
    test_labels = np.asarray(test[label])
    if classes is None:
        classes = tables._label_classes(site_labels, test_labels, label, source)
        tables._refuse_unseen_classes(site_labels, test_labels, tuple(classes), label, source)
    plan = imputation or ImputationPlan(strategy="")
    encoding = TableEncoding(
        label, tuple(order), vocabularies, tuple(str(c) for c in classes), dict(plan.fills), plan.indicators
    )
    for cid, report in sorted(reports.items()):
        try:
            tables._label_indices(np.array(list(report["labels"]), dtype=object), encoding.classes)
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(
                f"{source}: client {cid} holds label {err}, not one of the run's classes "
                f"{list(encoding.classes)}"
            ) from err
    # Each client's report as the embedded engine's: sums at the numeric features' places (one-hot
    # features are not standardised, so their sums do not matter), summed in client-id order.
    places = {name: i for i, name in enumerate(encoding.feature_names)}
    width = len(places)
    stats = []
    for _, report in sorted(reports.items()):
        total, total_sq = np.zeros(width), np.zeros(width)
        for name, s, q in zip(report["numeric"], report["sum"], report["sum_sq"], strict=True):
            total[places[name]], total_sq[places[name]] = s, q
        stats.append(FeatureStatistics(int(report["rows"]), total, total_sq))
    mean, std = combine_feature_statistics(stats, encoding.numeric)
    return encoding, mean, std


def reported_class_counts(reports: Mapping[int, Mapping[str, Any]], encoding: TableEncoding) -> np.ndarray:
    """The (clients, classes) matrix of the sites' self-reported label counts, clients in id order."""
    counts = np.zeros((len(reports), len(encoding.classes)), dtype=np.int64)
    for row, (_, report) in enumerate(sorted(reports.items())):
        values = list(report["labels"])
        idx = tables._label_indices(np.array(values, dtype=object), encoding.classes)
        for k, value in zip(idx, values, strict=True):
            counts[row, k] += int(report["labels"][value])
    return counts


# --------------------------------------------------------------------------------------------------------
# A data set's raw columns (the rows the embedded engine encodes), for exporting sites and for the server
# --------------------------------------------------------------------------------------------------------
def sklearn_table_columns(name: str) -> tuple[tables.Columns, tables.Columns]:
    """scikit-learn's ``wine`` / ``breast-cancer`` as (train, test) columns: its feature names, then
    ``label`` (the class names), split as ``load_sklearn_table`` splits them (test_size=0.25,
    stratify=y, random_state=0), rows in that order."""
    from sklearn import datasets as sk
    from sklearn.model_selection import train_test_split

    bunch = {"breast-cancer": sk.load_breast_cancer, "wine": sk.load_wine}[name]()
    x, y = np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)
    train_idx, test_idx = train_test_split(np.arange(len(y)), test_size=0.25, stratify=y, random_state=0)
    names = np.array([str(c) for c in bunch.target_names], dtype=object)

    def part(idx: np.ndarray) -> tables.Columns:
        cols = {str(f): x[idx, j] for j, f in enumerate(bunch.feature_names)}
        cols["label"] = names[y[idx]]
        return cols

    return part(train_idx), part(test_idx)


def sklearn_classes(name: str) -> tuple[str, ...]:
    from sklearn import datasets as sk

    bunch = {"breast-cancer": sk.load_breast_cancer, "wine": sk.load_wine}[name]()
    return tuple(str(c) for c in bunch.target_names)


def table_file_columns(
    path: str | os.PathLike,
    *,
    label: str,
    test_path: str | os.PathLike | None = None,
    test_fraction: float,
) -> tuple[tables.Columns, tables.Columns | None]:
    """A csv / parquet data set's raw (train, test) columns, train rows in the order
    ``load_table_files`` encodes them (a folder's site files in name order, each file's stem in a
    ``__client__`` column; a single file's rows, less a held-out test part). ``test`` is None when the data
    set has no test file (its test rows are held out of the train rows)."""
    from fedhet.data.datasets import tables as table_sets

    root = Path(path).expanduser()
    test = None
    if root.is_dir():
        files = sorted(p for p in (root / "train").glob("*") if p.suffix.lower() in TABLE_SUFFIXES)
        if not files:
            raise DataError(f"{root}: no train/<client>.csv files")
        parts = [read_table_file(f) for f in files]
        for part, file in zip(parts, files, strict=True):
            part["__client__"] = np.array([file.stem] * len(next(iter(part.values()), [])), dtype=object)
        train = tables.concat_tables(parts, str(root / "train"))
        test_files = [f for f in (root / "test.csv", root / "test.parquet") if f.is_file()] or sorted(
            p for p in (root / "test").glob("*") if p.suffix.lower() in TABLE_SUFFIXES
        )
        if test_path is None and test_files:
            test = tables.concat_tables([read_table_file(f) for f in test_files], str(root / "test"))
    else:
        train = read_table_file(root)
    if test_path is not None:
        test = read_table_file(test_path)
    if test is None:
        train, _ = table_sets._held_out_test(train, label, test_fraction, str(root.resolve()))
    return train, test


def server_test_columns(path: str | None, test_path: str | None, source: str) -> tables.Columns:
    """The test rows a table deployment's server evaluates on: ``data.test_path``, or the test file of the
    ``data.path`` folder; the server never needs the sites' training rows."""
    if test_path is not None:
        return read_table_file(test_path)
    if path is not None and Path(path).expanduser().is_dir():
        root = Path(path).expanduser()
        files = [f for f in (root / "test.csv", root / "test.parquet") if f.is_file()] or sorted(
            p for p in (root / "test").glob("*") if p.suffix.lower() in TABLE_SUFFIXES
        )
        if files:
            return tables.concat_tables([read_table_file(f) for f in files], str(root / "test"))
    raise DataError(
        f"{source}: the server of a deployment whose nodes hold their own tables evaluates on its own test "
        "table: set data.test_path to it (a .csv or .parquet file with the sites' columns)"
    )
