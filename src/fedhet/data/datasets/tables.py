"""Tables as data sets: CSV / Parquet files and data frames, and scikit-learn's tabular sets.

Their normalisation statistics are federated (``fedhet.data.datasets.standardization``): until a federation
aggregates its clients' reports, a table's are its train split's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.data.datasets.dataset import Dataset, to_tensor
from fedhet.data.datasets.imputation import check_impute_options, impute_table
from fedhet.data.datasets.standardization import client_feature_statistics, combine_feature_statistics
from fedhet.data.formats import tables
from fedhet.errors import ConfigError, DataError

#: Column names tried as the label when none is given.
TABLE_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
#: The held-out test fraction when a table comes without a test file (stratified, fixed seed 0).
DEFAULT_TEST_FRACTION = 0.2


# --------------------------------------------------------------------------------------------------------
# Building a tabular Dataset
# --------------------------------------------------------------------------------------------------------
def _dataset(name: str, encoded: tables.EncodedTable, source: str) -> Dataset:
    # Until a federation aggregates its clients' reports, the statistics are the train split's (one report).
    mean, std = combine_feature_statistics([client_feature_statistics(encoded.train_x)], encoded.numeric)
    return Dataset(
        name=name,
        train_x=to_tensor(encoded.train_x),
        train_y=to_tensor(encoded.train_y),
        test_x=to_tensor(encoded.test_x),
        test_y=to_tensor(encoded.test_y),
        classes=encoded.classes,
        mean=mean,
        std=std,
        source=source,
        feature_names=encoded.feature_names,
        numeric=encoded.numeric,
        train_sites=None if encoded.train_sites is None else to_tensor(encoded.train_sites),
        sites=encoded.sites,
    )


def _encode(
    train: tables.Columns,
    test: tables.Columns,
    *,
    label: str,
    client: str | None,
    categorical: Sequence[str],
    source: str,
    impute: str | None,
    missing_indicator: bool,
) -> tables.EncodedTable:
    """Encode the train and test tables, then impute their missing numbers if asked (else refused)."""
    encoded = tables.encode_table(
        train,
        test,
        label=label,
        client=client,
        categorical=categorical,
        source=source,
        keep_missing=impute is not None,
    )
    if impute is None:
        return encoded
    return impute_table(encoded, impute, missing_indicator, source)[0]


def _held_out_test(
    train: tables.Columns, label: str, fraction: float, source: str, client: str | None = None
) -> tuple[Any, Any]:
    """Split one table into train and test rows: stratified by label, seed 0, ``fraction`` to test. A site
    (``client`` column) the hold-out leaves without training rows is refused, named with the fix."""
    from sklearn.model_selection import train_test_split

    if not 0 < fraction < 1:
        raise ConfigError(f"{source}: test_fraction must lie in (0, 1), got {fraction!r}")
    labels = tables._categories(train[label]) if label in train else None
    if labels is None:
        raise DataError(f"{source}: no label column {label!r} (columns: {list(train)[:12]})")
    rows = np.arange(len(labels))
    _, counts = np.unique(labels, return_counts=True)
    stratify = labels if counts.min() >= 2 else None  # a class with one row cannot be in both halves
    try:
        train_rows, test_rows = train_test_split(rows, test_size=fraction, stratify=stratify, random_state=0)
    except ValueError as exc:  # too few rows to hold out one test row per class (scikit-learn's words)
        raise DataError(
            f"{source}: {len(rows)} row(s) with {len(counts)} classes cannot hold out a test set "
            f"({fraction:g} of the rows, stratified by label: {exc}): give a test file (data.test_path, or "
            "test.csv in the folder) or more rows"
        ) from exc
    train_rows, test_rows = np.sort(train_rows), np.sort(test_rows)
    pick = lambda cols, idx: {k: np.asarray(v)[idx] for k, v in cols.items()}  # noqa: E731
    if client is not None and client in train:
        sites = tables._categories(train[client])
        emptied = sorted(set(sites.tolist()) - set(sites[train_rows].tolist()))
        if emptied:
            named = ", ".join(f"{s!r} ({int(np.sum(sites == s))} row(s))" for s in emptied)
            raise DataError(
                f"{source}: the test hold-out ({fraction:g} of the rows, stratified by label, seed 0) takes "
                f"every row of site(s) {named}, which would then not be a client: give a test file "
                "(data.test_path, or test.csv in the folder), lower the test fraction, or add the site rows"
            )
    return pick(train, train_rows), pick(train, test_rows)


def from_table(
    train: Any,
    test: Any = None,
    *,
    label: str = "label",
    client: str | None = None,
    categorical: Sequence[str] = (),
    test_fraction: float = DEFAULT_TEST_FRACTION,
    name: str = "table",
    impute: str | None = None,
    missing_indicator: bool = False,
) -> Dataset:
    """A tabular :class:`Dataset` from data frames (pandas) or mappings column -> values.

    ``label`` names the class column; ``client`` (optional) the column naming each row's client — then
    ``data.split = "sites"`` gives every client its own rows. Non-numeric columns (and those listed in
    ``categorical``) are one-hot encoded. Without ``test``, a stratified ``test_fraction`` of the rows
    (seed 0) is held out as the test set. Features are kept as float32, never quantised. Missing numbers
    are refused, unless ``impute`` ("mean", "median" or "most_frequent") fills them with a value computed
    from the sites' reports on their training rows (``missing_indicator``: plus a 0/1 feature per such
    column; :mod:`fedhet.data.datasets.imputation`).
    """
    check_impute_options(impute, missing_indicator)
    source = f"from_table({name!r})"
    train_cols = tables.columns_from(train, f"{source} (train)")
    if test is None:
        train_cols, test_cols = _held_out_test(train_cols, label, test_fraction, source, client)
        source += f", {test_fraction:g} held out as test (stratified, seed 0)"
    else:
        test_cols = tables.columns_from(test, f"{source} (test)")
    encoded = _encode(
        train_cols, test_cols, label=label, client=client, categorical=categorical, source=source,
        impute=impute, missing_indicator=missing_indicator,
    )  # fmt: skip
    return _dataset(name, encoded, source)


def _read(path: Path) -> tables.Columns:
    kind = TABLE_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{path}: not a table file; give .csv or .parquet files")
    return tables.read_csv(path) if kind == "csv" else tables.read_parquet(path)


@dataclass(frozen=True)
class TableFiles:
    """A table as read from files, before encoding: train and test columns, the column naming each training
    row's site (``"__client__"`` for a folder of site files, whose values are the file names), where the
    test rows come from, and a name and a source for messages."""

    train: tables.Columns
    test: tables.Columns
    client: str | None
    test_from: str
    name: str
    source: str


#: The column that holds a folder's site names (the file stems).
FOLDER_SITE_COLUMN = "__client__"


def read_table_files(
    path: str | os.PathLike,
    *,
    label: str = "label",
    client: str | None = None,
    test_path: str | os.PathLike | None = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
) -> TableFiles:
    """The train and test columns of a table's files, read as :func:`load_table_files` reads them (the same
    test hold-out), not yet encoded: what ``fedhet data describe`` shows."""
    root = Path(path).expanduser()
    source = str(root.resolve())
    if root.is_dir():
        train_dir = root / "train"
        files = (
            sorted(p for p in train_dir.glob("*") if p.suffix.lower() in TABLE_SUFFIXES)
            if train_dir.is_dir()
            else []
        )
        if not files:
            raise DataError(
                f"{root}: a table folder holds train/<client>.csv (one file per client) and test.csv; found "
                f"no .csv or .parquet files in {train_dir}"
            )
        if client is not None:
            raise ConfigError(
                f"{root}: one file per client already says whose each row is; drop data.client_column"
            )
        parts = [_read(f) for f in files]
        empty = [
            f.name for f, part in zip(files, parts, strict=True) if not len(next(iter(part.values()), []))
        ]
        if empty:
            raise DataError(
                f"{train_dir}: site file(s) {empty} hold a header but no rows; every client needs rows: add "
                "its rows, or remove the file (the site is then not a client)"
            )
        client = FOLDER_SITE_COLUMN
        for part, file in zip(parts, files, strict=True):
            if client in part:
                raise DataError(f"{file}: a column may not be named {client!r}")
            part[client] = np.array([file.stem] * len(next(iter(part.values()), [])), dtype=object)
        train = tables.concat_tables(parts, str(train_dir))
        test_files = [root / "test.csv", root / "test.parquet"]
        test_files = [f for f in test_files if f.is_file()] or sorted(
            p for p in (root / "test").glob("*") if p.suffix.lower() in TABLE_SUFFIXES
        )
        if test_path is None and test_files:
            test = tables.concat_tables([_read(f) for f in test_files], str(root / "test"))
            test_from = ", ".join(str(f.relative_to(root)) for f in test_files)
        else:
            test = None
    elif root.is_file():
        train, test = _read(root), None
    else:
        raise DataError(f"data.path {path}: no such file or folder (looked at {root.resolve()})")
    if test_path is not None:
        test_file = Path(test_path).expanduser()
        if not test_file.is_file():
            raise DataError(f"data.test_path {test_path}: no such file (looked at {test_file.resolve()})")
        test = _read(test_file)
        test_from = str(test_file)
    if test is None:
        train, test = _held_out_test(train, label, test_fraction, source, client)
        test_from = f"{test_fraction:g} of the rows held out, stratified, seed 0"
        source += f" ({test_fraction:g} held out as test, stratified, seed 0)"
    name = root.stem if root.is_file() else root.name
    return TableFiles(train, test, client, test_from, name, source)


def load_table_files(
    path: str | os.PathLike,
    *,
    label: str = "label",
    client: str | None = None,
    categorical: Sequence[str] = (),
    test_path: str | os.PathLike | None = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    impute: str | None = None,
    missing_indicator: bool = False,
) -> Dataset:
    """A tabular :class:`Dataset` from files.

    ``path`` is one table (.csv or .parquet) — its ``client`` column, if named, says whose each row is — or
    a folder: ``train/<client>.csv`` (one file per client; the file name is the client) and ``test.csv``
    (or ``test/*.csv``). The test set is ``test_path`` if given, else the folder's test file(s), else a
    stratified ``test_fraction`` of the rows (seed 0). ``impute`` and ``missing_indicator`` as for
    :func:`from_table`.
    """
    check_impute_options(impute, missing_indicator)
    files = read_table_files(
        path, label=label, client=client, test_path=test_path, test_fraction=test_fraction
    )
    encoded = _encode(
        files.train, files.test, label=label, client=files.client, categorical=categorical,
        source=files.source, impute=impute, missing_indicator=missing_indicator,
    )  # fmt: skip
    return _dataset(files.name, encoded, files.source)


def load_sklearn_table(name: str) -> Dataset:
    """scikit-learn's ``breast-cancer`` (569 × 30, 2 classes) or ``wine`` (178 × 13, 3 classes), shipped with
    scikit-learn: split train_test_split(test_size=0.25, stratify=y, random_state=0), as digits is."""
    from sklearn import datasets as sk
    from sklearn.model_selection import train_test_split

    bunch = {"breast-cancer": sk.load_breast_cancer, "wine": sk.load_wine}[name]()
    x, y = np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)
    train_idx, test_idx = train_test_split(np.arange(len(y)), test_size=0.25, stratify=y, random_state=0)
    features = tuple(str(f) for f in bunch.feature_names)
    encoded = tables.EncodedTable(
        train_x=np.ascontiguousarray(x[train_idx], dtype=np.float32),
        train_y=y[train_idx],
        test_x=np.ascontiguousarray(x[test_idx], dtype=np.float32),
        test_y=y[test_idx],
        classes=tuple(str(c) for c in bunch.target_names),
        feature_names=features,
        numeric=(True,) * len(features),
        train_sites=None,
        sites=(),
    )
    split = "train_test_split(test_size=0.25, stratify=y, random_state=0)"
    return _dataset(name, encoded, f"sklearn.datasets.load_{name.replace('-', '_')}, {split}")
