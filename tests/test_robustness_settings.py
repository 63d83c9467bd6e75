"""The robustness page's defaults in two more settings (fedhet.studies.robustness_settings): the cells, the
ten-site table, and the page's verdicts and summary on hand-made values."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.studies import robustness as rb
from fedhet.studies import robustness_settings as rs

SETTING = "diabetes-by-age-10"


def test_every_setting_has_every_column_on_every_row_and_a_row_is_read_under_its_setting():
    cells = rs.cells()
    for setting in rs.SETTINGS:
        paths = {c.path for c in cells if c.path.startswith(setting + "/")}
        assert len(paths) == len(rs.rows(setting)) * len(rs._variants(1))
    sign_flip = next(c for c in cells if c.path == f"{SETTING}/sign-flip/f3/defaults")
    assert {k: v for k, v in sign_flip.overrides.items() if k.startswith("faults")} == {
        "faults.clients.0": "sign-flip",
        "faults.clients.1": "sign-flip",
        "faults.clients.2": "sign-flip",
    }
    assert rb._row_of(sign_flip.path) == ("sign-flip", 3)
    assert rb._row_of(f"{SETTING}/clean/undefended") == ("clean", 0)
    assert rb._row_of("flower-engine/ipm/f3/flower-median") == ("ipm", 3)
    assert rb._row_of("noise/f1/defaults") == ("noise", 1)


def test_the_ten_site_table_holds_every_training_patient_once_by_age_decile(tmp_path, monkeypatch):
    from sklearn.datasets import load_diabetes

    from fedhet.studies import diabetes_tables as ce

    monkeypatch.setattr(ce, "TABLE_DIR", tmp_path)
    ce.write_site_tables({"ten": ce.age_bands(10)})
    lines = (tmp_path / "ten.csv").read_text().splitlines()[1:]
    test = (tmp_path / "diabetes-test.csv").read_text().splitlines()[1:]
    assert len(lines) + len(test) == 442
    ages = np.array([float(line.split(",")[0]) for line in lines])
    sites = np.array([int(line.rsplit("-", 1)[1]) for line in lines])
    # deciles of the training patients' ages: ten sites, each near a tenth; older sites hold older patients
    counts = np.bincount(sites, minlength=10)
    assert len(counts) == 10 and counts.min() >= 20 and counts.max() <= 45
    for k in range(9):
        assert ages[sites == k].max() <= ages[sites == k + 1].min()
    assert ages.min() == ages[sites == 0].min() and ages.max() == ages[sites == 9].max()
    assert set(load_diabetes(scaled=False).data[:, 0]) >= set(ages)


def _cell(by_seed: dict[int, float]) -> dict[str, list]:
    return {"seed": list(by_seed), "accuracy": list(by_seed.values()), "weight": [], "top": []}


def _found() -> dict:
    """Every cell of the diabetes setting: clean 0.70/0.72/0.74 in every column (FedAvg as published 0.71,
    0.73, 0.75); sign-flip/f3 drops the defaults by 10 points in every seed and the first defence by 1,
    2 and 3 points; every other attacked cell equals its clean run."""
    found = {}
    for cell in rs.cells():
        setting, rest = cell.path.split("/", 1)
        row, _, variant = rest.rpartition("/")
        column = rs.column_name(variant)
        clean = {0: 0.71, 1: 0.73, 2: 0.75} if variant == "undefended" else {0: 0.70, 1: 0.72, 2: 0.74}
        values = dict(clean)
        if row == "sign-flip/f3" and variant == "defaults":
            values = {s: a - 0.10 for s, a in clean.items()}
        if row == "sign-flip/f3" and variant == rs.DEFENCES[0]:
            values = {0: 0.69, 1: 0.70, 2: 0.71}
        found[setting, row, column] = _cell(values)
    return found


def test_a_setting_is_judged_by_paired_intervals_as_the_robustness_page():
    lines = rs.setting_lines(_found(), SETTING)
    row = next(line for line in lines if line.startswith("| sign-flip/f3 |")).split(" | ")
    # defaults: 72.0 - 10 = 62.0 mean accuracy, change -10.0 in every seed
    assert row[2] == "62.0 (-10.0)"
    # the first defence: 70.0 mean, changes -1, -2, -3: mean -2.0, interval -2 ± 4.303 × 1/√3 = [-4.5, +0.5]
    assert row[3] == "70.0 (-2.0)"
    defaults = next(line for line in lines if line.startswith("- **FedAvg, defaults**"))
    assert "missed in sign-flip/f3 -10.0 [-10.0, -10.0]" in defaults
    defence = next(line for line in lines if line.startswith(f"- **{rs.column_name(rs.DEFENCES[0])}**"))
    attacked = 2 * len(rs.SETTINGS[SETTING][3])
    # every attacked row changes by 0 in every seed but sign-flip/f3: [-4.5, +0.5] lies above -5, met too
    assert f"target met in {attacked}, not resolved in 0, missed in none." in defence


def test_a_setting_without_records_says_it_is_not_measured():
    found = {key: {**cell, "accuracy": []} if key[0] == SETTING else cell for key, cell in _found().items()}
    assert rs.setting_lines(found, SETTING) == [
        "Not measured yet: `fedhet study robustness-settings run` runs it (resumable)."
    ]
    assert rs.setting_lines(_found(), SETTING)[0].startswith("| hostile clients |")


def test_the_summary_gives_clean_cost_and_the_worst_change_per_setting():
    lines = rs.summary_lines(_found(), None)
    head = lines[0].split(" | ")
    assert head[1:] == [*rs.SETTINGS][:-1] + [list(rs.SETTINGS)[-1] + " |"]
    defaults = next(line for line in lines if line.startswith("| FedAvg, defaults |")).split(" | ")
    # clean 70/72/74 against FedAvg's 71/73/75: -1.0; worst at f = 3 sign-flip -10.0; at f = 1 every row 0
    assert defaults[1].startswith("-1.0; -10.0 (sign-flip); ")
    assert defaults[1].endswith("+0.0 (scale)")


@pytest.mark.parametrize("variant", ["undefended", "defaults", *rs.DEFENCES])
def test_each_column_is_named_as_the_robustness_page_names_it(variant):
    assert rs.column_name(variant) in rb.COLUMNS


def test_the_committed_page_renders_again_from_the_records(tmp_path, monkeypatch):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    committed = (root / rs.STUDY.page).read_text()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs" / "results").mkdir(parents=True)
    monkeypatch.setattr(rb, "RECORDS", str(root / rb.RECORDS))
    records = root / "docs" / "results" / "cells" / rs.STUDY.name
    rs.write_page([], {"records": records})
    rendered = (tmp_path / rs.STUDY.page).read_text()
    assert rendered.replace(str(records), "RECORDS") == committed.replace(
        f"docs/results/cells/{rs.STUDY.name}", "RECORDS"
    )
