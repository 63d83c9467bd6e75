"""The analysis tools under tools/ whose printed figures the result pages cite, against hand calculations."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_cell(cell: Path, standalone: list[float], evaluations: list[dict]) -> Path:
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text(json.dumps({"standalone": standalone}))
    (cell / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evaluations))
    return cell


def test_fedrac_causes_classifies_each_missing_client_as_below_or_above_its_window(tmp_path):
    causes = load_tool("fedrac_causes")
    # α = 0.5, s = (0.5, 0.6, 0.8), max s = 0.8. Hand calculation of upper_i = (0.5 + 0.5·s_i/0.8)·max a:
    # round 2, a = (0.5, 0.85, 0.9), max a = 0.9: upper = (0.73125, 0.7875, 0.9).
    #   client 0: a = s = 0.5 → below; client 1: 0.85 > 0.7875 → above; client 2: 0.9, not > 0.9 → inside.
    #   rate 1/3; windows upper − s = (0.23125, 0.1875, 0.1), mean 0.1729167.
    # round 3 (final), a = (0.7, 0.88, 0.88): max a = 0.88, upper = (0.715, 0.77, 0.88): client 0 inside
    #   (0.5 < 0.7 ≤ 0.715), client 1 above (tied with client 2), client 2 inside (0.88 ≤ 0.88): rate 2/3.
    s = [0.5, 0.6, 0.8]
    evals = [
        {"round": 1, "accuracy": 0.3},  # not evaluated for rewards: skipped
        {"round": 2, "rewards": [0.5, 0.85, 0.9], "fairness_pearson": 10.0, "bcf_rate": 1 / 3},
        {"round": 3, "rewards": [0.7, 0.88, 0.88], "fairness_pearson": 30.0, "bcf_rate": 2 / 3},
    ]
    facts = causes.cell_facts(write_cell(tmp_path / "fedrac-seed0", s, evals), alpha=0.5)
    assert facts["fairness_best"] == 30.0 and facts["fairness_best_round"] == 3
    assert facts["fairness_last100"] == pytest.approx(20.0)
    assert facts["rate_best"] == {
        "round": 3,
        "rate": pytest.approx(2 / 3),
        "below": 0,
        "above": 1,
        "tied_above": 1,
    }
    assert facts["rate_final"]["round"] == 3
    below, above, width = causes.bcf_classes(np.asarray(s), np.asarray([0.5, 0.85, 0.9]), 0.5)
    assert (below, above) == (1, 1)
    assert causes.tied_above(np.asarray(s), np.asarray([0.5, 0.85, 0.9]), 0.5) == 0  # client 1 is above alone
    assert width == pytest.approx((0.23125 + 0.1875 + 0.1) / 3)
    # final round: max a − max s = 0.08; windows (0.215, 0.17, 0.08), mean 0.155; largest tie 2
    assert facts["gain_points"] == pytest.approx(8.0)
    assert facts["window_points"] == pytest.approx(15.5)
    assert facts["largest_tie"] == 2
    # final a − s = (0.2, 0.28, 0.08): 8 to 28 points; at the best-rate round (3) no client is below;
    # the lowest client (s = 0.5) has a = 0.5 exactly in round 2 only: 1 of the 2 evaluations
    assert facts["final_gap_points"] == pytest.approx((8.0, 28.0))
    assert facts["below_at_best_rate"] == []
    assert facts["lowest_equal"] == (1, 2)


def test_fedrac_causes_refuses_a_logged_rate_it_cannot_recompute(tmp_path):
    causes = load_tool("fedrac_causes")
    evals = [{"round": 1, "rewards": [0.5, 0.85, 0.9], "fairness_pearson": 1.0, "bcf_rate": 1.0}]
    with pytest.raises(SystemExit, match="logged rate"):
        causes.cell_facts(write_cell(tmp_path / "c", [0.5, 0.6, 0.8], evals), alpha=0.5)


def test_fedrac_causes_prints_a_cell_whose_fairness_is_undefined(tmp_path, monkeypatch, capsys):
    """Equal rewards for every client (IAFL on CLA gives everyone one model): no Pearson is logged, and the
    tool says so instead of failing on the row."""
    causes = load_tool("fedrac_causes")
    s = [0.5, 0.6, 0.8]
    # a = 0.9 for all: max a = 0.9, upper = (0.73125, 0.7875, 0.9): clients 0 and 1 above, client 2 inside
    evals = [{"round": 1, "rewards": [0.9, 0.9, 0.9], "bcf_rate": 1 / 3}]
    write_cell(tmp_path / "runs" / "cla" / "iafl-seed0", s, evals)
    monkeypatch.setattr("sys.argv", ["fedrac_causes.py", str(tmp_path / "runs")])
    causes.main()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("iafl-seed0"))
    assert line.startswith("iafl-seed0 | undefined (None) | undefined | undefined | 0.3 (1): 0/2 (2)")


def test_fedrac_causes_names_the_clients_below_at_the_best_rate_and_the_lowest_clients_exact_ties(tmp_path):
    causes = load_tool("fedrac_causes")
    # s = (0.1, 0.5, 0.8), α = 0.5. Round 1, a = (0.1, 0.75, 0.85): max a 0.85, upper = (0.478125, 0.690625,
    #   0.85); client 0 a = s → below, client 1 0.75 > 0.690625 → above, client 2 inside: rate 1/3.
    # Round 2, a = (0.1, 0.45, 0.9): upper = (0.50625, 0.73125, 0.9); clients 0 and 1 below: rate 1/3.
    # Round 3, a = (0.2, 0.6, 0.85): upper = (0.478125, 0.690625, 0.85); all inside: rate 1 (best).
    s = [0.1, 0.5, 0.8]
    evals = [
        {"round": 1, "rewards": [0.1, 0.75, 0.85], "fairness_pearson": 90.0, "bcf_rate": 1 / 3},
        {"round": 2, "rewards": [0.1, 0.45, 0.9], "fairness_pearson": 95.0, "bcf_rate": 1 / 3},
        {"round": 3, "rewards": [0.2, 0.6, 0.85], "fairness_pearson": 99.0, "bcf_rate": 1.0},
    ]
    facts = causes.cell_facts(write_cell(tmp_path / "fedrac-seed0", s, evals), alpha=0.5)
    assert facts["rate_best"]["round"] == 3 and facts["below_at_best_rate"] == []
    assert facts["lowest_equal"] == (2, 3)  # client 0 at exactly 0.1 in rounds 1 and 2
    assert facts["final_gap_points"] == pytest.approx((5.0, 10.0))  # a − s = (0.1, 0.1, 0.05)
    # without round 3 the best rate is round 1's (the first of the tied maxima): client 0 below, 10 → 10
    facts = causes.cell_facts(write_cell(tmp_path / "fedrac-seed1", s, evals[:2]), alpha=0.5)
    assert facts["rate_best"]["round"] == 1
    assert facts["below_at_best_rate"] == [pytest.approx((10.0, 10.0))]
    assert facts["final_gap_points"] == pytest.approx((-5.0, 10.0))  # round 2: a − s = (0, −0.05, 0.1)
    # Near is not equal: client 0 at 0.1004 (s = 0.1). Final a − s = (0.04, 10, −35) points: the range runs
    # from the most negative. Round 1, a = (0.1004, 0.6, 0.45): max a 0.6, upper = (0.3375, 0.4875, 0.6):
    # client 0 inside, client 1 above, client 2 below: rate 1/3.
    near = [{"round": 1, "rewards": [0.1004, 0.6, 0.45], "fairness_pearson": 50.0, "bcf_rate": 1 / 3}]
    facts = causes.cell_facts(write_cell(tmp_path / "fedrac-seed2", s, near), alpha=0.5)
    assert facts["lowest_equal"] == (0, 1)
    assert facts["final_gap_points"] == pytest.approx((-35.0, 10.0))
    assert facts["below_at_best_rate"] == [pytest.approx((80.0, 45.0))]
