"""``fedhet data describe``: a table's columns, sites, classes and test rows, counted by hand, before any
training; and the short form a table run prints first."""

from __future__ import annotations

import csv
import json
import os

import pytest

from fedhet.cli import main


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def _write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows(rows)


HEADER = ["dose", "colour", "outcome"]


def _clinics(root):
    """Two sites: east (3 rows, one dose NA) and west (4 rows, one colour empty, the only 'rare' row)."""
    _write_csv(root / "train" / "east.csv", [HEADER, ["1.5", "red", "cured"], ["2.5", "blue", "cured"],
                                             ["NA", "red", "worse"]])  # fmt: skip
    _write_csv(root / "train" / "west.csv", [HEADER, ["3", "green", "cured"], ["4", "red", "worse"],
                                             ["5", "red", "rare"], ["6", "", "worse"]])  # fmt: skip
    _write_csv(root / "test.csv", [HEADER, ["2", "red", "cured"], ["3", "blue", "worse"]])
    return root


def _describe(folder, *extra):
    return ["data", "describe", "--dataset", "csv", "--data-path", str(folder),
            "--set", "data.label_column=outcome", *extra]  # fmt: skip


def test_describe_json_reports_the_hand_counted_table(tmp_path, capsys):
    folder = _clinics(tmp_path / "clinics")
    assert main(_describe(folder, "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["columns"] == [
        {"name": "dose", "type": "numeric", "levels": 6, "first_levels": ["1.5", "2.5", "3", "4", "5"],
         "min": 1.5, "max": 6.0, "missing": {"east": 1, "west": 0}, "missing_test": 0},
        {"name": "colour", "type": "categorical", "levels": 4,
         "first_levels": ["(missing)", "blue", "green", "red"], "missing": {"east": 0, "west": 1},
         "missing_test": 0},
        {"name": "outcome", "type": "label", "levels": 3, "first_levels": ["cured", "rare", "worse"]},
    ]  # fmt: skip
    assert out["sites_from"] == "files" and out["classes"] == ["cured", "rare", "worse"]
    assert out["sites"] == [
        {"name": "east", "rows": 3, "classes": {"cured": 2, "rare": 0, "worse": 1}},
        {"name": "west", "rows": 4, "classes": {"cured": 1, "rare": 1, "worse": 2}},
    ]
    assert out["train"] == {"rows": 7, "classes": {"cured": 3, "rare": 1, "worse": 3}}
    assert out["classes_at_one_site"] == {"rare": "west"}
    assert out["test"] == {"rows": 2, "classes": {"cured": 1, "rare": 0, "worse": 1}, "from": "test.csv"}
    assert len(out["warnings"]) == 1
    assert out["warnings"][0].startswith(
        "numeric column 'dose' has 1 missing cell(s) (train and test): a run"
    )


def test_describe_text_names_sites_and_classes_and_creates_no_run_folder(tmp_path, capsys, monkeypatch):
    folder = _clinics(tmp_path / "clinics")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(_describe(folder)) == 0
    text = capsys.readouterr().out
    assert "  east  3 rows: cured 2, rare 0, worse 1" in text
    assert "  west  4 rows: cured 1, rare 1, worse 2" in text
    assert "classes (3): cured, rare, worse" in text
    assert "classes only one site holds: rare (west)" in text
    assert "missing: east 1" in text and "missing: west 1" in text
    assert "warning: numeric column 'dose'" in text
    assert os.listdir(work) == []  # no runs/ folder: it never trains


def test_a_client_column_and_a_held_out_test_and_a_high_cardinality_warning(tmp_path, capsys):
    rows = [["id", "x", "hospital", "y"]]
    rows += [[f"p{i}", str(i), "north" if i < 10 else "south", "yes" if i % 2 else "no"] for i in range(20)]
    _write_csv(tmp_path / "all.csv", rows)
    args = ["data", "describe", "--dataset", "csv", "--data-path", str(tmp_path / "all.csv"), "--set",
            "data.label_column=y", "--set", "data.client_column=hospital", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    # the run's hold-out: 0.2 of 20 rows stratified by y, seed 0 -> 4 test rows, 2 of each class
    assert out["test"]["rows"] == 4 and out["test"]["classes"] == {"no": 2, "yes": 2}
    assert out["test"]["from"] == "0.2 of the rows held out, stratified, seed 0"
    assert sum(s["rows"] for s in out["sites"]) == 16 and [s["name"] for s in out["sites"]] == [
        "north",
        "south",
    ]
    assert out["sites_from"] == "column 'hospital'"
    assert [c["type"] for c in out["columns"]] == ["categorical", "numeric", "site", "label"]
    assert out["columns"][0]["levels"] == 16
    assert out["warnings"] == [
        "categorical column 'id' has 16 levels over 16 training rows, one-hot encoded into as many features: "
        "an identifier (drop it) or numbers read as text?"
    ]


def test_describe_refuses_data_that_is_not_a_table_file(capsys):
    assert main(["data", "describe", "--dataset", "wine"]) == 2
    assert "fedhet data describe reads a table (data.dataset = 'csv' or 'parquet'" in capsys.readouterr().err


def test_a_table_run_prints_rows_per_site_columns_and_classes_first(tmp_path, capsys):
    folder = _clinics(tmp_path / "clinics")
    code = main(["run", "--dataset", "csv", "--data-path", str(folder), "--set", "data.label_column=outcome",
                 "--set", "data.impute=median", "--set", "data.split=sites", "--set", "data.clients=2",
                 "--model", "tabular-mlp", "--rounds", "1", "--out", str(tmp_path / "run"),
                 "--json"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err.splitlines()[:3] == [
        f"fedhet: table {folder.resolve()}: rows per site: east 3, west 4; test 2 rows (test.csv)",
        "fedhet: columns: 2 features: dose (numeric), colour (4 levels); label 'outcome'",
        "fedhet: classes (3): cured, rare, worse",
    ]
    json.loads(captured.out)  # stdout stays the JSON summary


def test_a_table_compare_prints_the_short_description_once_first_on_stderr(tmp_path, capsys):
    """Two methods, one description: before any method trains, not once per method, and never on stdout."""
    folder = _clinics(tmp_path / "clinics")
    code = main(["compare", "--dataset", "csv", "--data-path", str(folder),
                 "--set", "data.label_column=outcome", "--set", "data.impute=median",
                 "--set", "data.split=sites", "--set", "data.clients=2", "--model", "tabular-mlp",
                 "--rounds", "1", "--methods", "fedavg,standalone", "--no-report",
                 "--out", str(tmp_path / "compare")])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    first = f"fedhet: table {folder.resolve()}: rows per site: east 3, west 4; test 2 rows (test.csv)"
    assert captured.err.splitlines()[:3] == [
        first,
        "fedhet: columns: 2 features: dose (numeric), colour (4 levels); label 'outcome'",
        "fedhet: classes (3): cured, rare, worse",
    ]
    assert captured.err.count("fedhet: table ") == 1 and "rows per site" not in captured.out
    assert "fedavg" in captured.out and "standalone" in captured.out  # the results table, on stdout
