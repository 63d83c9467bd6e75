"""A method parameter whose default changed after runs were recorded (CELM's evidence clip: 0, the paper's
evidence, then 1): runs at today's default are another experiment, while every record and run file written
before the change keeps its fingerprint and reads back as it ran
(fedhet.config_sections.CHANGED_METHOD_DEFAULTS).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedhet.algorithms import build_strategy
from fedhet.config import ExperimentConfig, load_run_config, to_toml
from fedhet.config_sections import CHANGED_METHOD_DEFAULTS

CELLS = Path(__file__).resolve().parents[1] / "docs" / "results" / "cells" / "robustness"


def celm(**params) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.method.name = "celm"
    cfg.method.params = {"warmup_fraction": 0.1, **params}
    return cfg


@pytest.mark.parametrize("method", sorted(CHANGED_METHOD_DEFAULTS))
def test_each_declared_default_is_the_methods_own(method):
    strategy = build_strategy(method, {})
    for key, (before, now) in CHANGED_METHOD_DEFAULTS[method].items():
        assert getattr(strategy, key) == now != before
        assert getattr(build_strategy(method, {key: before}), key) == before


def test_todays_default_is_another_experiment_than_the_value_before():
    default, paper, clip = celm(), celm(evidence_clip=0), celm(evidence_clip=1.0)
    assert default.run_fingerprint() == clip.run_fingerprint() == celm(evidence_clip=1).run_fingerprint()
    assert default.run_fingerprint() != paper.run_fingerprint()
    assert celm(evidence_clip=2).run_fingerprint() not in (default.run_fingerprint(), paper.run_fingerprint())
    # a method without changed defaults fingerprints its params as given
    fedavg = ExperimentConfig()
    assert fedavg.run_fingerprint() == ExperimentConfig().run_fingerprint()


def test_records_written_before_the_change_keep_their_fingerprints():
    """Known answers from before the change: the robustness page's CELM records were computed with the
    default then (0, no ``evidence_clip`` in params) and with ``evidence_clip = 1`` set; today the first is
    the paper's-evidence column (0 set) and the second the default."""
    from fedhet.studies import robustness
    from fedhet.studies.base import cell_fingerprints

    cells = {cell.path: cell for cell in robustness.cells()}
    for path in ("clean/paper-evidence", "sign-flip/f3/paper-evidence", "clean/defaults", "ipm/f1/defaults"):
        recorded = json.loads((CELLS / path / "celm-seed0.json").read_text())["experiment"]
        assert cell_fingerprints(cells[path], 0, {})["celm"] == recorded


def test_a_run_file_keeps_how_the_run_ran(tmp_path):
    # written today: the default is in the file, and reads back as the same experiment
    default = celm()
    (tmp_path / "new.toml").write_text(to_toml(default))
    assert "evidence_clip = 1" in (tmp_path / "new.toml").read_text()
    again = load_run_config(tmp_path / "new.toml")
    assert again.method.params["evidence_clip"] == 1
    assert again.run_fingerprint() == default.run_fingerprint()
    # written before the change (no such key): it ran with the value before, and resumes so
    before = to_toml(default).replace("evidence_clip = 1, ", "").replace(", evidence_clip = 1", "")
    assert "evidence_clip" not in before
    (tmp_path / "old.toml").write_text(before)
    old = load_run_config(tmp_path / "old.toml")
    assert old.method.params["evidence_clip"] == 0
    assert build_strategy("celm", old.method.params).evidence_clip == 0
    assert old.run_fingerprint() == celm(evidence_clip=0).run_fingerprint()
    # another method's file is read as written
    (tmp_path / "fedavg.toml").write_text(to_toml(ExperimentConfig()))
    assert load_run_config(tmp_path / "fedavg.toml").method.params == {}


def test_an_unset_learning_rate_is_the_models_own_and_fingerprints_as_that_rate():
    from fedhet.engine.schedule import learning_rate
    from fedhet.experiment import apply_method_defaults

    table = ExperimentConfig()
    table.model.name = "tabular-mlp"
    assert table.train.lr is None and table.learning_rate() == 0.3 and learning_rate(table, 1) == 0.3
    assert table.run_fingerprint() == table.copy(**{"train.lr": 0.3}).run_fingerprint()
    assert table.run_fingerprint() != table.copy(**{"train.lr": 0.1}).run_fingerprint()
    notices = apply_method_defaults(table, [build_strategy("fedavg", {})])
    assert notices == [
        "model 'tabular-mlp' trains with train.lr = 0.3 by default (fedhet's general default is 0.1; set "
        "train.lr to choose another value)"
    ]
    assert apply_method_defaults(table.copy(**{"train.lr": 0.1}), [build_strategy("fedavg", {})]) == []
    image = ExperimentConfig()
    assert image.learning_rate() == 0.1 == learning_rate(image, 1)
    assert image.run_fingerprint() == image.copy(**{"train.lr": 0.1}).run_fingerprint()


def test_table_records_computed_with_the_rate_set_stand_for_the_rate_unset():
    """Known answers from before the change: table-defaults' records of lr 0.3 set (now its defaults row)
    and of the then-default 0.1 (now its lr-0.1 row, which sets it)."""
    from fedhet.studies import table_defaults
    from fedhet.studies.base import cell_fingerprints

    records = CELLS.parent / "table-defaults" / "diabetes-by-age"
    for variant in ("defaults", "lr-0.1"):
        cell = next(c for c in table_defaults.cells() if c.path == f"diabetes-by-age/{variant}")
        recorded = json.loads((records / variant / "fedavg-seed0.json").read_text())["experiment"]
        assert cell_fingerprints(cell, 0, {})["fedavg"] == recorded
