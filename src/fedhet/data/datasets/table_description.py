"""What a table holds, before any training: ``fedhet data describe`` and the first lines of a table run.

:func:`describe_table` reads a table's columns as a run reads them (``read_table_files``: the same sites,
the same test rows) and reports, without encoding or training: per column the type a run gives it
(numeric, categorical, label, site), its levels and its missing cells per site; per site its rows and
class counts; the classes only one site holds; the test rows; and warnings (what a run would refuse or
warn about). Site and class names are the table's own: file stems, site-column values, label values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedhet.data.datasets.tables import (
    DEFAULT_TEST_FRACTION,
    FOLDER_SITE_COLUMN,
    TableFiles,
    read_table_files,
)
from fedhet.data.datasets.user_data import _user_file
from fedhet.data.formats import tables
from fedhet.errors import DataError

#: How many levels of a column the description lists.
FIRST_LEVELS = 5


def _missing_mask(values: np.ndarray) -> np.ndarray:
    return np.array([tables._is_missing(v) for v in values], dtype=bool)


def _count_by(names: np.ndarray, order: Sequence[str]) -> dict[str, int]:
    return {name: int(np.count_nonzero(names == name)) for name in order}


def _number_text(value: float) -> str:
    return f"{value:g}"


def describe_table(
    files: TableFiles, *, label: str, categorical: Sequence[str] = (), impute: str | None = None
) -> dict[str, Any]:
    """A JSON-ready description of a table's files (see the module docstring); never encodes or trains."""
    train, test, client = files.train, files.test, files.client
    for part, table in (("train", train), ("test", test)):
        if label not in table:
            raise DataError(
                f"{files.source}: no label column {label!r} in the {part} table (columns: "
                f"{list(table)[:12]}); name it with data.label_column"
            )
    if client is not None and client not in train:
        raise DataError(f"{files.source}: no client column {client!r} (columns: {list(train)[:12]})")
    warnings: list[str] = []
    classes = tables._label_classes(train[label], test[label], label, files.source)
    class_names = np.array(classes, dtype=object)
    train_classes = class_names[tables._label_indices(train[label], classes)]
    test_classes = class_names[tables._label_indices(test[label], classes)]
    n_train = len(train_classes)

    site_of = tables._categories(train[client]) if client is not None else None
    sites = sorted(set(site_of.tolist())) if site_of is not None else []
    columns: list[dict[str, Any]] = []
    for name in train:
        if name == client and client == FOLDER_SITE_COLUMN:
            continue  # the folder's files name the sites: not a column of the user's table
        values = np.asarray(train[name])
        entry: dict[str, Any] = {"name": name}
        if name == label:
            entry.update(type="label", levels=len(classes), first_levels=list(classes[:FIRST_LEVELS]))
            columns.append(entry)
            continue
        if name == client:
            entry.update(type="site", levels=len(sites), first_levels=sites[:FIRST_LEVELS])
            columns.append(entry)
            continue
        test_values = np.asarray(test[name]) if name in test else None
        if test_values is None:
            warnings.append(
                f"column {name!r} is not in the test table: a run refuses it; give the test rows it"
            )
        missing = _missing_mask(values)
        missing_entry = {
            "missing": _count_by(site_of[missing], sites)
            if site_of is not None
            else {"train": int(missing.sum())},
            "missing_test": int(_missing_mask(test_values).sum()) if test_values is not None else None,
        }
        numbers = None if name in categorical else tables._as_numbers(values)
        test_numbers = None if numbers is None or test_values is None else tables._as_numbers(test_values)
        if numbers is not None and (test_values is None or test_numbers is not None):
            present = numbers[~np.isnan(numbers)]
            distinct = np.unique(present)
            entry.update(
                type="numeric",
                levels=int(distinct.size),
                first_levels=[_number_text(v) for v in distinct[:FIRST_LEVELS]],
                min=float(present.min()) if present.size else None,
                max=float(present.max()) if present.size else None,
            )
            cells = int(missing.sum()) + (missing_entry["missing_test"] or 0)
            if cells and impute is None:
                warnings.append(
                    f"numeric column {name!r} has {cells} missing cell(s) (train and test): a run refuses "
                    "them; set data.impute = 'mean', 'median' or 'most_frequent' to fill them"
                )
            elif cells:
                warnings.append(
                    f"numeric column {name!r}: {cells} missing cell(s) filled by data.impute={impute}"
                )
            if not present.size:
                warnings.append(f"numeric column {name!r} has no present training value")
        else:
            if name not in categorical and test_values is not None:
                warnings += [
                    f"{problem}: a run refuses it; list the column in data.categorical_columns if it is a "
                    "category"
                    for problem in tables._mostly_numbers(name, values, test_values, None, ())
                ]
            levels = sorted(set(tables._categories(values).tolist()))
            entry.update(type="categorical", levels=len(levels), first_levels=levels[:FIRST_LEVELS])
            if tables.many_levels(len(levels), n_train):
                warnings.append(
                    f"categorical column {name!r} has {len(levels)} levels over {n_train} training rows, "
                    "one-hot encoded into as many features: an identifier (drop it) or numbers read as text?"
                )
        columns.append({**entry, **missing_entry})

    site_entries = [
        {
            "name": s,
            "rows": int(np.count_nonzero(site_of == s)),
            "classes": _count_by(train_classes[site_of == s], classes),
        }
        for s in sites
    ]
    at_one_site: dict[str, str] = {}
    if len(sites) > 1:
        for c in classes:
            holders = [e["name"] for e in site_entries if e["classes"][c]]
            if len(holders) == 1:
                at_one_site[c] = holders[0]
    only_test = [c for c in classes if not np.any(train_classes == c)]
    if only_test:
        warnings.append(
            f"class(es) {only_test} only the test rows hold: a run refuses them (no client can learn them)"
        )
    return {
        "source": files.source,
        "label": label,
        "sites_from": "files" if client == FOLDER_SITE_COLUMN else (f"column {client!r}" if client else None),
        "columns": columns,
        "classes": list(classes),
        "train": {"rows": n_train, "classes": _count_by(train_classes, classes)},
        "sites": site_entries,
        "classes_at_one_site": at_one_site,
        "test": {
            "rows": len(test_classes),
            "classes": _count_by(test_classes, classes),
            "from": files.test_from,
        },
        "warnings": warnings,
    }


def describe_table_files(
    kind: str,
    path: str | None,
    root: str | None = None,
    *,
    label: str = "label",
    client: str | None = None,
    categorical: Sequence[str] = (),
    test_path: str | None = None,
    impute: str | None = None,
    missing_indicator: bool = False,
    test_fraction: float = DEFAULT_TEST_FRACTION,
) -> dict[str, Any]:
    """:func:`describe_table` of the files a run with ``data.dataset = kind`` (csv / parquet) and these table
    options (``fedhet.engine.simulation.table_options``) reads; ``missing_indicator`` changes nothing here."""
    files = read_table_files(
        _user_file(kind, path, root),
        label=label,
        client=client,
        test_path=test_path,
        test_fraction=test_fraction,
    )
    return describe_table(files, label=label, categorical=categorical, impute=impute)


def describe_text(description: dict[str, Any]) -> str:
    """The description as a person reads it (``fedhet data describe`` without ``--json``)."""
    d = description
    lines = [f"table: {d['source']}"]
    lines.append(f"columns ({len(d['columns'])}):")
    width = max(len(c["name"]) for c in d["columns"])
    for c in d["columns"]:
        first = ", ".join(c["first_levels"]) + (", …" if c["levels"] > len(c["first_levels"]) else "")
        text = f"  {c['name']:<{width}}  {c['type']:<11}  {c['levels']} level(s): {first}"
        if c["type"] == "numeric" and c.get("min") is not None:
            text += f"  (range {c['min']:g} .. {c['max']:g})"
        missing = {k: v for k, v in c.get("missing", {}).items() if v}
        if missing or c.get("missing_test"):
            parts = [f"{site} {n}" for site, n in missing.items()]
            if c.get("missing_test"):
                parts.append(f"test {c['missing_test']}")
            text += "  missing: " + ", ".join(parts)
        lines.append(text)
    classes = d["classes"]
    lines.append(f"classes ({len(classes)}): {', '.join(classes)}")

    def counts(entry: dict[str, int]) -> str:
        return ", ".join(f"{name} {n}" for name, n in entry.items())

    if d["sites"]:
        lines.append(f"sites ({len(d['sites'])}, from {d['sites_from']}):")
        width = max(len(s["name"]) for s in d["sites"])
        for s in d["sites"]:
            lines.append(f"  {s['name']:<{width}}  {s['rows']} rows: {counts(s['classes'])}")
    else:
        lines.append("sites: none named (data.split deals the rows out)")
    lines.append(f"train: {d['train']['rows']} rows: {counts(d['train']['classes'])}")
    if d["classes_at_one_site"]:
        lines.append(
            "classes only one site holds: "
            + ", ".join(f"{c} ({s})" for c, s in d["classes_at_one_site"].items())
        )
    lines.append(f"test: {d['test']['rows']} rows ({d['test']['from']}): {counts(d['test']['classes'])}")
    for warning in d["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def describe_short(description: dict[str, Any]) -> list[str]:
    """The few lines a table run prints first: rows per site, columns, classes, and the warnings' count."""
    d = description
    features = [c for c in d["columns"] if c["type"] in ("numeric", "categorical")]
    kinds = ", ".join(
        f"{c['name']} (numeric)" if c["type"] == "numeric" else f"{c['name']} ({c['levels']} levels)"
        for c in features
    )
    sites = ", ".join(f"{s['name']} {s['rows']}" for s in d["sites"]) or "none named"
    test = d["test"]
    more = ", …" if len(d["classes"]) > 20 else ""
    lines = [
        f"table {d['source']}: rows per site: {sites}; test {test['rows']} rows ({test['from']})",
        f"columns: {len(features)} features: {kinds}; label {d['label']!r}",
        f"classes ({len(d['classes'])}): {', '.join(d['classes'][:20])}{more}",
    ]
    if d["warnings"]:
        lines.append(f"{len(d['warnings'])} warning(s): see fedhet data describe with the same flags")
    return lines
