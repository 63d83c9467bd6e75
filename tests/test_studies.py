"""The studies behind docs pages (``fedhet study NAME``): their formulas against hand calculations, and a real
study run at tiny scale, resumed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedhet.studies import fedrac_causes as causes
from fedhet.studies.base import RunLog


def write_cell(cell: Path, standalone: list[float], evaluations: list[dict]) -> Path:
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text(json.dumps({"standalone": standalone}))
    (cell / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evaluations))
    return cell


def test_fedrac_causes_classifies_each_missing_client_as_below_or_above_its_window(tmp_path):
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
    evals = [{"round": 1, "rewards": [0.5, 0.85, 0.9], "fairness_pearson": 1.0, "bcf_rate": 1.0}]
    with pytest.raises(ValueError, match="logged rate"):
        causes.cell_facts(write_cell(tmp_path / "c", [0.5, 0.6, 0.8], evals), alpha=0.5)


def test_fedrac_causes_prints_a_cell_whose_fairness_is_undefined(tmp_path):
    """Equal rewards for every client (IAFL on CLA gives everyone one model): no Pearson is logged, and the
    tool says so instead of failing on the row."""
    s = [0.5, 0.6, 0.8]
    # a = 0.9 for all: max a = 0.9, upper = (0.73125, 0.7875, 0.9): clients 0 and 1 above, client 2 inside
    evals = [{"round": 1, "rewards": [0.9, 0.9, 0.9], "bcf_rate": 1 / 3}]
    write_cell(tmp_path / "runs" / "cla" / "iafl-seed0", s, evals)
    text = causes.table([tmp_path / "runs"], {"alpha": 0.5})
    line = next(x for x in text.splitlines() if x.startswith("iafl-seed0"))
    assert line.startswith("iafl-seed0 | undefined (None) | undefined | undefined | 0.3 (1): 0/2 (2)")


def test_fedrac_causes_names_the_clients_below_at_the_best_rate_and_the_lowest_clients_exact_ties(tmp_path):
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


# -- the robustness study ----------------------------------------------------------------------------------
def _robustness_run(
    cell: Path, method: str, seed: int, accuracy: float, lines: list[dict], **summary
) -> None:
    run = cell / f"{method}-seed{seed}"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"final": {"accuracy": accuracy}, **summary}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_robustness_reads_the_hostile_weight_tabulates_the_change_and_checks_the_targets(tmp_path):
    from fedhet.studies import robustness

    # FedAvg: the hostile client's share of each round's average, mean over rounds: (0.1 + 0.3) / 2 = 0.2;
    # CELM: its last reported contribution (0.7); FedRAC: its reward accuracy (0.25); with f = 3 the three
    # hostile clients' shares add up: 0.1 + 0.1 + 0.2 = 0.4.
    fedavg_lines = [{"aggregation_weights": {"0": 0.1, "1": 0.9}}, {"aggregation_weights": {"0": 0.3}}]
    celm_lines = [{"contributions": [0.5, 0.5]}, {"contributions": [0.7, 0.3]}, {"accuracy": 0.1}]
    three = [{"aggregation_weights": {"0": 0.1, "1": 0.1, "2": 0.2, "3": 0.6}}]
    for seed, clean_acc, noisy_acc in ((0, 0.80, 0.50), (1, 0.90, 0.70)):
        _robustness_run(tmp_path / "clean" / "undefended", "fedavg", seed, clean_acc, fedavg_lines)
        _robustness_run(tmp_path / "noise/f1" / "undefended", "fedavg", seed, noisy_acc, fedavg_lines)
    _robustness_run(tmp_path / "noise/f1" / "defaults", "celm", 0, 0.4, celm_lines)
    _robustness_run(tmp_path / "noise/f1" / "defaults", "fedrac", 0, 0.3, [], rewards=[0.25, 0.9])
    _robustness_run(tmp_path / "noise/f3" / "undefended", "fedavg", 0, 0.6, three)
    cell = tmp_path / "noise/f1" / "defaults"
    undefended = RunLog.read(tmp_path / "noise/f1/undefended/fedavg-seed0")
    assert robustness.hostile_weight(undefended, "fedavg", (0,)) == 0.2
    assert robustness.hostile_weight(RunLog.read(cell / "celm-seed0"), "celm", (0,)) == pytest.approx(0.7)
    assert robustness.hostile_weight(RunLog.read(cell / "fedrac-seed0"), "fedrac", (0,)) == pytest.approx(
        0.25
    )
    f3 = RunLog.read(tmp_path / "noise/f3/undefended/fedavg-seed0")
    assert robustness.hostile_weight(f3, "fedavg", (0, 1, 2)) == pytest.approx(0.4)
    # CELM's hostile client holds the top weight (0.7 against 0.3); FedAvg's does not (0.2 against 0.45)
    assert robustness._hostile_on_top(RunLog.read(cell / "celm-seed0"), "celm", (0,))
    assert not robustness._hostile_on_top(undefended, "fedavg", (0,))
    text = robustness.table([tmp_path], {})
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ") for r in text.splitlines() if r.startswith("| ")}
    # FedAvg under noise: mean accuracy 60.0 against the clean 85.0: −25.0 points, weight 0.20
    assert rows["noise/f1"][1] == "0.20 · 60.0 (-25.0)"
    assert rows["clean"][1] == "85.0"
    assert rows["noise/f3"][1] == "0.40 · 60.0 (-20.0)"  # seed 0 only: against seed 0's clean 80.0
    celm, fedrac = list(robustness.COLUMNS).index("CELM") + 1, list(robustness.COLUMNS).index("FedRAC") + 1
    assert rows["noise/f1"][celm] == "0.70 · 40.0"  # CELM has no clean run here: no change shown
    assert rows["noise/f1"][fedrac].rstrip(" |") == "25 % · 30.0"  # FedRAC's reward as a percentage
    assert rows["nan/f1"][1] == "–"  # nothing ran
    assert "mean of 1 to 2 seeds" in text
    # a column measured at fewer seeds than the most says so in its head (its means average other seeds)
    _robustness_run(tmp_path / "clean" / "defaults", "celm", 0, 0.5, celm_lines)
    head = robustness.table([tmp_path], {}).splitlines()[0]
    assert "| FedAvg |" in head and "| CELM (1 seed) |" in head


def test_robustness_targets_are_computed_from_the_defaults_cells(tmp_path):
    from fedhet.studies import robustness

    ok = [{"aggregation_weights": {"0": 0.05, "5": 0.95}}]  # an honest client on top
    # a clean run that rejected client 4 once and clipped client 2 once; its norms 1, 2, 6 and 1, 3, 3:
    # medians 2 and 3, largest honest ratio 6 / 2 = 3.0 (by hand)
    norms = [{"update_norms": {"0": 1.0, "1": 2.0, "2": 6.0}, "clipped": {"2": 0.67}}]
    norms += [{"update_norms": {"0": 1.0, "1": 3.0, "2": 3.0}}]
    clean_lines = [{"rejected": {"4": "norm"}}, *norms, *ok]
    for seed, clean in enumerate((0.80, 0.82, 0.84)):
        _robustness_run(
            tmp_path / "clean" / "defaults", "fedavg", seed, clean, clean_lines if seed == 0 else ok
        )
    # noise/f1: -1 point in every seed: no spread, the interval is [-1, -1], above -2: met
    # noise/f3: -10, -11, -12: mean -11, sd 1, t(0.975, 2) = 4.3027 -> half 4.3027 / sqrt(3) = 2.484:
    # [-13.5, -8.5], below -5: missed
    # sign-flip/f1: -1, -3, +1: mean -1, sd 2 -> half 4.969: [-6.0, +4.0], straddles -2: not resolved
    for seed, (f1, f3, flip) in enumerate(((0.79, 0.70, 0.79), (0.81, 0.71, 0.79), (0.83, 0.72, 0.85))):
        _robustness_run(tmp_path / "noise/f1" / "defaults", "fedavg", seed, f1, ok)
        _robustness_run(tmp_path / "noise/f3" / "defaults", "fedavg", seed, f3, ok)
        _robustness_run(tmp_path / "sign-flip/f1" / "defaults", "fedavg", seed, flip, ok)
    _robustness_run(tmp_path / "scale/f1" / "defaults", "fedavg", 0, 0.5, ok)  # one seed: no interval
    lines = robustness.targets(robustness.collect(tmp_path))
    fedavg = next(line for line in lines if "FedAvg, defaults" in line)
    not_yet = 2 * len(robustness.ATTACKS) - 4
    assert (
        f"(4 attacked rows measured, {not_yet} not yet): accuracy target met in 1 of 4 attacked rows;"
        in fedavg
    )
    assert "missed in noise/f3 -11.0 [-13.5, -8.5];" in fedavg
    assert "not resolved in scale/f1 (one seed); sign-flip/f1 -1.0 [-6.0, +4.0];" in fedavg
    assert "noise/f1" not in fedavg and "honest updates rejected in the clean runs: 1; clipped: 1;" in fedavg
    assert "largest honest update-norm ratio to the round's median there: 3.0" in fedavg
    assert "- **CELM**: not measured yet (no clean run)" in lines
    # a hostile client on top counts only where the same clients were not on top in the clean run: client 1
    # (hostile at f = 3) is the largest in seed 1 with and without the attack; client 0 takes it in seed 0
    other = tmp_path / "other"
    big1 = [{"aggregation_weights": {"1": 0.6, "5": 0.4}}]
    big0 = [{"aggregation_weights": {"0": 0.6, "5": 0.4}}]
    _robustness_run(other / "clean" / "defaults", "fedavg", 0, 0.80, ok)
    _robustness_run(other / "clean" / "defaults", "fedavg", 1, 0.80, big1)
    _robustness_run(other / "stale/f3" / "defaults", "fedavg", 0, 0.80, big0)
    _robustness_run(other / "stale/f3" / "defaults", "fedavg", 1, 0.80, big1)
    fedavg = next(
        line for line in robustness.targets(robustness.collect(other)) if "FedAvg, defaults" in line
    )
    assert "hostile on top in stale/f3 in 1 seed(s)" in fedavg


def test_robustness_flower_columns_are_the_same_rules_computed_by_flower(tmp_path):
    from fedhet.studies import robustness

    by_path = {cell.path: cell for cell in robustness.cells()}
    for rule in robustness.FLOWER_COLUMNS:
        ours, theirs = by_path[f"ipm/f3/{rule}"].overrides, by_path[f"ipm/f3/flower-{rule}"].overrides
        assert theirs == {**ours, "aggregation.implementation": "flower"}
    # the engine check: identical accuracies, and a difference of 0.5 points in the first evaluation only
    # (every evaluation is compared, not just the final one)
    lines = [{"accuracy": 0.5}, {"accuracy": 0.7}]
    for path, flower in (
        ("clean/flower-median", lines),
        ("clean/flower-krum", [{"accuracy": 0.505}, lines[1]]),
    ):
        _robustness_run(tmp_path / path, "fedavg", 0, 0.7, lines)
        _robustness_run(
            tmp_path / robustness.ENGINE_CHECK_DIR / path, "fedavg", 0, flower[-1]["accuracy"], flower
        )
    table = "\n".join(robustness.engine_check_lines(tmp_path))
    assert "| clean/flower-median | 70.00 | 70.00 | identical |" in table
    # the engine check's runs are recorded as their rows' runs are: a clean one says who is on top at each
    # f, an attacked one (ipm, f = 3) gives the hostile clients' weight
    flower_cells = {flower.path: flower for _, flower in robustness.engine_check_cells()}
    clean = flower_cells[f"{robustness.ENGINE_CHECK_DIR}/clean/flower-median"]
    values = robustness.run_values(clean, tmp_path / clean.path / "fedavg-seed0", "fedavg")
    assert (
        values["accuracies"] == [0.5, 0.7] and {"top_f1", "top_f3"} <= set(values) and "weight" not in values
    )
    ipm = flower_cells[f"{robustness.ENGINE_CHECK_DIR}/ipm/f3/flower-median"]
    _robustness_run(tmp_path / ipm.path, "fedavg", 0, 0.6, [{"aggregation_weights": {"0": 0.1, "1": 0.2}}])
    assert robustness.run_values(ipm, tmp_path / ipm.path / "fedavg-seed0", "fedavg")["weight"] == (
        pytest.approx(0.3)
    )
    assert "| clean/flower-krum | 70.00 | 70.00 | differ by up to 0.50 pts |" in table
    assert "trimmed-mean" not in table  # not run: not shown


def test_every_study_has_a_page_that_exists_and_cells_on_shipped_experiments():
    from fedhet.config import load_config
    from fedhet.studies import STUDIES, get_study

    root = Path(__file__).resolve().parents[1]
    for name in STUDIES:
        study = get_study(name)
        assert study.name == name and (root / study.page).is_file(), name
        for cell in study.cells() if study.cells else []:
            load_config(cell.config)  # a shipped experiment name, resolvable from any directory
    with pytest.raises(Exception, match="unknown study 'nope'; accepted: robustness"):
        get_study("nope")


@pytest.mark.slow
def test_a_study_runs_at_tiny_scale_tabulates_and_resumes_without_rerunning(tmp_path):
    """The audit-validation study end to end on real Fashion-MNIST subsets (its three settings, one seed, two
    rounds): every cell runs through fedhet.compare, the table counts each flag over the runs, and a second
    `run` reuses every finished cell (no summary is rewritten)."""
    from fedhet.studies import get_study, run_study

    study = get_study("audit-validation")
    tiny = {"train.rounds": 2, "data.max_train_samples": 600, "data.max_test_samples": 200, "eval.every": 1}
    said: list[str] = []
    run_study(study, tmp_path, seeds=1, jobs=1, overrides=tiny, echo=said.append)
    assert [s.split("] ")[1].split(":")[0] for s in said] == ["free-rider", "maverick", "faults"]
    assert said[0].startswith("[seed 0: 1/3]")
    summaries = sorted(tmp_path.glob("*/*-seed0/summary.json"))
    assert [p.parent.parent.name + "/" + p.parent.name for p in summaries] == [
        "faults/celm-seed0",
        "free-rider/celm-seed0",
        "free-rider/cgsv-seed0",
        "maverick/celm-seed0",
    ]
    written = {p: p.stat().st_mtime_ns for p in summaries}
    text = study.table([tmp_path], {})
    assert text.startswith("| flag | method | true positives |")
    # the faults setting injects three faulty clients; each run names them in its line of the table
    assert "faults:" in text and "celm seed 0:" in text
    run_study(study, tmp_path, seeds=1, jobs=1, overrides=tiny, echo=said.append)
    assert {p: p.stat().st_mtime_ns for p in summaries} == written


def test_the_study_command_lists_tabulates_draws_and_refuses_clearly(tmp_path, capsys):
    from fedhet.cli import main

    assert main(["study"]) == 0
    listed = capsys.readouterr().out
    from fedhet.studies import STUDIES

    assert "robustness: hostile clients" in listed and f"{len(STUDIES)} studies" in listed
    assert all(f"{name}:" in listed for name in STUDIES)
    # a robustness table and its figure from runs made earlier (here: written by hand)
    lines = [{"aggregation_weights": {"0": 0.1}}]
    _robustness_run(tmp_path / "runs" / "noise/f1" / "undefended", "fedavg", 0, 0.5, lines)
    _robustness_run(tmp_path / "runs" / "clean" / "undefended", "fedavg", 0, 0.8, lines)
    png = tmp_path / "fig" / "robustness.png"
    assert main(["study", "robustness", "table", str(tmp_path / "runs"), "--figure", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| noise/f1 | 0.10 · 50.0 (-30.0) |" in out and png.stat().st_size > 10_000
    # an analysis with its own option, and the errors a user can act on
    assert main(["study", "fedrac-causes", "table", str(tmp_path / "none"), "--alpha", "0.3"]) == 2
    assert "does not exist; it reads the runs of `fedhet reproduce" in capsys.readouterr().err
    assert main(["study", "nope"]) == 2
    assert "unknown study 'nope'; accepted: robustness" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: fedrac-causes makes no runs, so it has no `run` action
        main(["study", "fedrac-causes", "run"])


def test_fedhet_robustness_page_writes_the_results_page_and_figure_from_recorded_runs(
    tmp_path, capsys, monkeypatch
):
    from fedhet.cli import main
    from fedhet.studies import robustness

    by_path = {cell.path: cell for cell in robustness.cells()}
    lines = [{"aggregation_weights": {"0": 0.1}}]
    runs = tmp_path / "runs"
    for path, acc in (("noise/f1/undefended", 0.5), ("clean/undefended", 0.8)):
        _robustness_run(runs / path, "fedavg", 0, acc, lines, fedhet_commit="abc1234")
        (runs / path / "fedavg-seed0" / "config.toml").write_text(
            _cell_config_toml(by_path[path], "fedavg", 0)
        )
    (tmp_path / "checkout" / "docs").mkdir(parents=True)
    assert main(["robustness", "page", "--out", str(runs), "--root", str(tmp_path / "checkout")]) == 0
    page = (tmp_path / "checkout" / "docs" / "results" / "robustness.md").read_text()
    assert "| noise/f1 | 0.10 · 50.0 (-30.0) |" in page and "1 seed(s), computed at commit(s) abc1234" in page
    assert "- **CELM**: not measured yet (no clean run)" in page
    assert (tmp_path / "checkout" / "docs" / "figures" / "robustness.png").stat().st_size > 10_000
    (tmp_path / "empty" / "docs").mkdir(parents=True)
    args = ["robustness", "page", "--out", str(tmp_path / "none"), "--root", str(tmp_path / "empty")]
    assert main(args) == 2
    assert "run `fedhet robustness run --out" in capsys.readouterr().err


def _cell_config_toml(cell, method: str, seed: int, **changes) -> str:
    """The config.toml a run of ``cell`` writes (its config, overrides and method), with ``changes``."""
    from fedhet.api import as_config
    from fedhet.comparison import comparison_configs
    from fedhet.config import to_toml

    base = as_config(cell.config, {**cell.overrides, **changes})
    return to_toml(comparison_configs(base, list(cell.methods), [seed])[[*cell.methods].index(method)])


def test_robustness_records_its_runs_and_renders_the_page_from_the_records_alone(tmp_path, monkeypatch):
    """Runs are scratch, records are committed: `fedhet robustness page --out RUNS` records each finished run
    of a cell as defined now (a run of another experiment is not recorded), and the page rendered again
    with the runs deleted shows the same cells. A record of a cell whose definition has since changed (its
    experiment fingerprint differs) is not shown."""
    from fedhet.cli import main
    from fedhet.reproduce.store import method_stamp
    from fedhet.studies import robustness

    by_path = {cell.path: cell for cell in robustness.cells()}
    runs, root = tmp_path / "runs", tmp_path / "checkout"
    monkeypatch.chdir(tmp_path)  # `page` without --out reads the default runs/robustness: none here
    # the runs computed under today's stamp, as the round loop names it in each stretch of rounds
    stretch = [{"commit": "abc1234", "results": method_stamp("fedavg"), "from_round": 1}]
    (root / "docs").mkdir(parents=True)
    lines = [{"aggregation_weights": {"0": 0.1, "1": 0.9}, "accuracy": 0.5}]
    for path, acc, changes in (
        ("clean/undefended", 0.8, {}),
        ("noise/f1/undefended", 0.5, {}),
        ("noise/f3/undefended", 0.6, {"train.rounds": 2}),  # not the cell's experiment: not recorded
    ):
        _robustness_run(runs / path, "fedavg", 0, acc, lines, fedhet_commits=stretch, wall_time_s=36.0)
        config = _cell_config_toml(by_path[path], "fedavg", 0, **changes)
        (runs / path / "fedavg-seed0" / "config.toml").write_text(config)
    assert main(["robustness", "page", "--out", str(runs), "--root", str(root)]) == 0
    records = root / robustness.RECORDS
    assert sorted(p.relative_to(records).as_posix() for p in records.rglob("*.json")) == [
        "clean/undefended/fedavg-seed0.json",
        "noise/f1/undefended/fedavg-seed0.json",
    ]
    record = json.loads((records / "noise/f1/undefended/fedavg-seed0.json").read_text())
    # the values the table reads, by hand: weight 0.1 (client 0's share), final accuracy 0.5
    assert record["values"]["weight"] == pytest.approx(0.1) and record["values"]["accuracy"] == 0.5
    assert record["commits"] == ["abc1234"] and record["code"] == method_stamp("fedavg")
    first = (root / robustness.PAGE).read_text()
    assert "| noise/f1 | 0.10 · 50.0 (-30.0) |" in first and "| noise/f3 | – |" in first
    assert "computed at commit(s) abc1234, 0.0 CPU-hours" in first  # 2 × 36 s = 0.02 h
    # the same runs recorded again from summaries that name no stamp (written before stamps): the records
    # keep the stamp they were written with, so `run` still skips them
    for path in ("clean/undefended", "noise/f1/undefended"):
        summary_file = runs / path / "fedavg-seed0" / "summary.json"
        old = json.loads(summary_file.read_text())
        summary_file.write_text(json.dumps({**old, "fedhet_commits": [{"commit": "abc1234"}]}))
    assert main(["robustness", "page", "--out", str(runs), "--root", str(root)]) == 0
    assert json.loads((records / "noise/f1/undefended/fedavg-seed0.json").read_text()) == record

    import shutil

    shutil.rmtree(runs)
    assert main(["robustness", "page", "--out", str(runs), "--root", str(root)]) == 0
    assert (root / robustness.PAGE).read_text() == first
    # a run resumed at another commit names both, each commit once
    resumed = records / "noise/f1/undefended/fedavg-seed0.json"
    resumed.write_text(json.dumps({**record, "commits": ["abc1234", "abc1234", "def5678"]}))
    assert main(["robustness", "page", "--root", str(root)]) == 0
    assert "computed at commit(s) abc1234, def5678, 0.0 CPU-hours" in (root / robustness.PAGE).read_text()
    # the clean cell redefined (here: its record says another experiment): its seed is gone from the page
    clean = records / "clean/undefended/fedavg-seed0.json"
    clean.write_text(json.dumps({**json.loads(clean.read_text()), "experiment": "0123456789abcdef"}))
    assert main(["robustness", "page", "--root", str(root)]) == 0
    page = (root / robustness.PAGE).read_text()
    assert "| noise/f1 | 0.10 · 50.0 |" in page and "| clean | – |" in page


@pytest.mark.slow
def test_a_recorded_study_skips_recorded_seeds_without_its_runs_and_reruns_them_when_the_code_changes(
    tmp_path, monkeypatch
):
    """run_study with records, on a one-cell study (FedAvg, real Fashion-MNIST subset, two rounds): the
    finished run is recorded with the value its table reads; with the runs deleted, a second run makes no
    run (its seed is recorded under the same results stamp); after a bump of a module the method reaches it
    runs again."""
    import fedhet.algorithms.fedavg as fedavg_module
    from fedhet.reproduce import store
    from fedhet.studies.base import CompareCell, Study, read_summary, run_study

    cell = CompareCell("tiny", "robustness/fmnist-n10", ("fedavg",), {"train.rounds": 2, "eval.every": 1})
    study = Study(
        name="tiny",
        title="one cell",
        page="none.md",
        default_out="runs/tiny",
        table=lambda dirs, options: "",
        cells=lambda: [cell],
        record=lambda cell, run, method: {"final": read_summary(run)["final"]["accuracy"]},
    )
    tiny = {"data.max_train_samples": 600, "data.max_test_samples": 200}
    runs, records = tmp_path / "runs", tmp_path / "records"
    said: list[str] = []
    run_study(study, runs, seeds=1, jobs=1, overrides=tiny, echo=said.append, records=records)
    summary = json.loads((runs / "tiny" / "fedavg-seed0" / "summary.json").read_text())
    record = json.loads((records / "tiny" / "fedavg-seed0.json").read_text())
    assert record["values"] == {"final": summary["final"]["accuracy"]} and record["seed"] == 0
    assert said == ["[seed 0: 1/1] tiny: robustness/fmnist-n10 fedavg train.rounds=2 eval.every=1"]

    import shutil

    shutil.rmtree(runs)
    said.clear()
    run_study(study, runs, seeds=1, jobs=2, overrides=tiny, echo=said.append, records=records)
    assert not runs.exists() and said == ["[seed 0] 1 of 1 cells recorded already"]
    assert record["code"] == store.method_stamp("fedavg") and "fedavg=1" in record["code"]
    # what FedAvg's module computes changed (its version bumped): that seed runs again, in this process
    monkeypatch.setattr(fedavg_module, "RESULTS_VERSION", fedavg_module.RESULTS_VERSION + 1)
    run_study(study, runs, seeds=1, jobs=1, overrides=tiny, echo=said.append, records=records)
    assert (runs / "tiny" / "fedavg-seed0" / "summary.json").is_file()
    assert "fedavg=2" in json.loads((records / "tiny" / "fedavg-seed0.json").read_text())["code"]


def test_the_gated_fssl_ordering_is_judged_by_paired_seeds():
    """ProxyFL − SAGE = (+2.0, +2.2, +1.8): mean 2.0, sd 0.2, half-width 4.3027 · 0.2 / √3 = 0.4968 (by
    hand): holds. SAGE − GPL = (+1, −1, +0.5): not resolved. GPL − labeled-only = (−3.0, −3.1, −2.9):
    contradicted, so the ordering as a whole is contradicted; the three protocol gates pass."""
    from fedhet.report.fssl_gates import fssl_gates, gates_markdown

    labeled = {0: 50.0, 1: 52.0, 2: 48.0}
    gpl = {s: v - d for (s, v), d in zip(labeled.items(), (3.0, 3.1, 2.9), strict=True)}
    sage = {s: v + d for (s, v), d in zip(gpl.items(), (1.0, -1.0, 0.5), strict=True)}
    proxyfl = {s: v + d for (s, v), d in zip(sage.items(), (2.0, 2.2, 1.8), strict=True)}
    acc = {"fedavg-labeled": labeled, "fixmatch-gpl": gpl, "sage": sage, "proxyfl": proxyfl,
           "fedavg-full": {0: 70.0, 1: 71.0, 2: 69.0}}  # fmt: skip
    report = fssl_gates(acc, {"fixmatch-gpl": {0: 0.3, 1: 0.3, 2: 0.3}})
    assert report.valid and [v for _, v in report.ordering] == ["holds", "not resolved", "contradicted"]
    assert report.verdict == "contradicted"
    text = gates_markdown(report)
    assert "- **holds**: ProxyFL > SAGE: mean +2.00, 95 % interval [+1.50, +2.50]" in text
    assert "the ordering as a whole **contradicted** at 3 seed(s)" in text


def test_celms_distance_from_fedavgs_weights_is_the_total_variation_to_the_sample_shares(tmp_path):
    """Sizes 30 and 10: FedAvg weighs (0.75, 0.25). Rounds with weights (0.5, 0.5), then (0.75, 0.25): total
    variation ½(0.25 + 0.25) = 0.25, then 0 (by hand); mean 0.125, final 0."""
    from fedhet.studies.celm_table1_causes import weights_from_sample_shares

    cell = tmp_path / "celm-seed0"
    cell.mkdir()
    (cell / "summary.json").write_text(json.dumps({"client_sizes": [30, 10]}))
    lines = [
        {"round": 1, "contributions": [0.5, 0.5]},
        {"round": 2},
        {"round": 3, "contributions": [0.75, 0.25]},
    ]
    (cell / "metrics.jsonl").write_text("\n".join(json.dumps(ln) for ln in lines) + "\n")
    assert weights_from_sample_shares(cell) == pytest.approx((0.125, 0.0))


def test_celm_table1_causes_correlates_celms_distance_from_fedavgs_weights_with_its_lead(tmp_path):
    """Three seeds whose distance from the shares (0, 0.1, 0.2) grows with CELM − FedAvg (0, +1, +2 points):
    a perfect line, r = +1; the per-seed differences are printed as they are."""
    from fedhet.studies.celm_table1_causes import table

    row = tmp_path / "runs" / "dir-0.05"
    for seed, (shift, lead) in enumerate([(0.0, 0.0), (0.1, 0.01), (0.2, 0.02)]):
        for method, accuracy in (("celm", 0.80 + lead), ("fedavg", 0.80)):
            cell = row / f"{method}-seed{seed}"
            cell.mkdir(parents=True)
            summary = {"client_sizes": [50, 50], "final": {"accuracy": accuracy}}
            (cell / "summary.json").write_text(json.dumps(summary))
            line = {"round": 1, "contributions": [0.5 + shift, 0.5 - shift]}
            (cell / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    text = table([tmp_path / "runs"], {})
    assert "per seed ['0', '1', '2']: +0.00, +1.00, +2.00 (mean +1.00)" in text
    assert "mean over rounds / final, per seed: 0.000 / 0.000, 0.100 / 0.100, 0.200 / 0.200" in text
    assert "across 3 (row, seed) pairs: Pearson r between CELM's mean distance" in text and "= +1.00" in text
