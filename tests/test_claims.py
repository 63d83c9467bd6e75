"""Findings as data: a table's claims judged from the recorded cells, paired by seed, 95 % t-interval."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.errors import ConfigError
from fedhet.reproduce import load_spec
from fedhet.reproduce.claims import (
    CONTRADICTED,
    HOLDS,
    UNRESOLVED,
    Claim,
    evaluate,
    findings_section,
    judge,
    judge_row,
    load_claims,
    paired_interval,
)

#: Two-sided 95 % Student-t quantiles from a printed table (not from scipy): df -> t_{0.975, df}.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_the_paired_interval_is_the_t_interval_of_a_hand_calculation():
    # d = (1, 2, 3): mean 2, sample sd 1, half-width t_{0.975,2} · 1/√3 = 4.303/1.732 = 2.484
    mean, low, high = paired_interval([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0)
    assert (low, high) == pytest.approx((2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)), abs=1e-3)
    # d = (0.5, 1.5): mean 1, sd √0.5, half-width 12.706 · √0.5/√2 = 6.353
    assert paired_interval([0.5, 1.5])[1:] == pytest.approx((1 - 6.353, 1 + 6.353), abs=1e-3)


@pytest.mark.parametrize(
    ("differences", "lower_is_better", "expected"),
    [
        ([1.0, 1.2, 0.9, 1.1, 1.0], False, HOLDS),  # mean 1.04, half-width 2.776 · 0.114/√5 = 0.14
        ([-1.0, -1.2, -0.9, -1.1, -1.0], False, CONTRADICTED),
        ([-1.0, -1.2, -0.9, -1.1, -1.0], True, HOLDS),  # less is better: a negative difference holds
        ([1.0, 2.0, 3.0], False, UNRESOLVED),  # interval [-0.48, 4.48] contains 0
        ([5.0], False, UNRESOLVED),  # one seed: no interval
        ([0.3, 0.3, 0.3], False, UNRESOLVED),  # no spread at all: no t-interval (a 0/1 metric, say)
    ],
)
def test_a_verdict_holds_only_when_the_interval_excludes_zero_in_the_claimed_direction(
    differences, lower_is_better, expected
):
    assert judge(differences, lower_is_better)[0] == expected


def test_a_row_pairs_only_the_seeds_both_methods_have_a_value_for():
    claim = Claim("a beats b", "a", "b")
    row = {
        "row": "r",
        "available": True,
        "methods": {
            "a": {"per_seed": {"0": 80.0, "1": 81.0, "2": None, "3": 82.0, "4": 79.5}},
            "b": {"per_seed": {"0": 78.0, "1": 79.5, "2": 70.0, "3": 80.0}},
        },
    }
    verdict = judge_row(claim, row)
    # seeds 0, 1, 3 (seed 2: a has no value; seed 4: b did not run): d = (2, 1.5, 2), mean 1.8333,
    # sd 0.2887, half-width 4.303 · 0.2887/√3 = 0.717: [1.116, 2.551] > 0
    assert verdict.seeds == 3 and verdict.mean == pytest.approx(11 / 6)
    assert verdict.low == pytest.approx(11 / 6 - 0.717, abs=2e-3) and verdict.verdict == HOLDS
    kept = judge_row(claim, {"row": "r", "available": True, "methods": {"a": {"ours": 80.0}, "b": {}}})
    assert kept.verdict == UNRESOLVED and "no per-seed values" in kept.why
    lines = findings_section([claim, Claim("b beats a", "b", "a", rows=("nope",))], [row], "points")
    text = "\n".join(lines)
    assert "- **holds**: a beats b (`a` vs `b`; 1 of 1 rows measured)" in text
    assert "  - r: holds: mean difference +1.83 over 3 paired seeds, 95 % interval [+1.12, +2.55]" in text
    assert "- **not resolved**: b beats a" in text  # it applies to no row: nothing holds
    # a row not run judges nothing: the claim holds on the one measured row, and says how many there were
    offline = {"row": "r", "available": False, "metric": "m2", "methods": {"a": {}, "b": {}}}
    text = "\n".join(findings_section([claim], [{**row, "metric": "m1"}, offline], "points"))
    assert "- **holds**: a beats b (`a` vs `b`; 1 of 2 rows measured)" in text
    assert "  - r (m2): not resolved (the row was not run)" in text  # one name, two metrics: told apart
    contradicted = {**row, "methods": {"a": row["methods"]["b"], "b": row["methods"]["a"]}}
    text = "\n".join(findings_section([claim], [row, contradicted], "points"))
    assert "- **contradicted**: a beats b" in text and "  - r: contradicted: mean difference -1.83" in text
    one_seed = {**row, "methods": {"a": {"per_seed": {"0": 80.0}}, "b": {"per_seed": {"0": 78.0}}}}
    text = "\n".join(findings_section([claim], [one_seed], "points"))  # no interval from one seed
    assert "  - r: not resolved at 1 seed: mean difference +2.00 over 1 paired seed\n" in text + "\n"
    # a row shown in another view than the table's (judged False) is for reading: only r is judged
    other_view = {**contradicted, "row": "r (best)", "judged": False}
    text = "\n".join(findings_section([claim], [row, other_view], "points"))
    assert "- **holds**: a beats b (`a` vs `b`; 1 of 1 rows measured)" in text and "r (best)" not in text


def test_claims_are_checked_when_a_table_loads(tmp_path):
    with pytest.raises(ConfigError, match="better = 'celm' is not one of the table's methods"):
        load_claims(tmp_path, [{"text": "t", "better": "celm", "than": "fedavg"}], ["fedavg"])
    with pytest.raises(ConfigError, match='claim 1 needs text = "..."'):
        load_claims(tmp_path, [{"better": "fedavg", "than": "fedavg"}], ["fedavg"])
    with pytest.raises(ConfigError, match="unknown keys"):
        load_claims(tmp_path, [{"text": "t", "better": "a", "than": "a", "verdict": "holds"}], ["a"])


@pytest.mark.slow
def test_a_table_leads_with_the_verdicts_of_its_claims_computed_from_its_runs(tmp_path, capsys):
    """Three seeds of two methods on one row: the per-seed values are the runs' own summaries, and the
    verdict printed is the one the paired differences of those summaries give (recomputed here)."""
    cfg = tmp_path / "small.toml"
    cfg.write_text(
        "[data]\ndataset = 'fashion-mnist'\nsplit = 'iid'\nclients = 3\nmax_train_samples = 1500\n"
        "max_test_samples = 500\n[train]\nrounds = 2\nlocal_steps = 5\n[eval]\nfairness = false\n"
    )
    spec = tmp_path / "table.toml"
    spec.write_text(
        "title = 'toy'\nmetric = 'accuracy'\nseeds = 3\nmethods = ['fedavg', 'fedprox']\n"
        "[[claims]]\ntext = 'FedProx is more accurate than FedAvg'\nbetter = 'fedprox'\nthan = 'fedavg'\n"
        "[[rows]]\nname = 'iid'\nconfig = 'small.toml'\nmethod_params = { fedprox = { mu = 1.0 } }\n"
    )
    out, page = tmp_path / "out", tmp_path / "page.md"
    assert main(["reproduce", str(spec), "--out", str(out), "--json", "--quiet", "--page", str(page)]) == 0
    [row] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    values = {}
    for method in ("fedavg", "fedprox"):
        for seed in range(3):
            summary = json.loads((Path(row["run_dir"]) / f"{method}-seed{seed}" / "summary.json").read_text())
            values[method, seed] = 100 * summary["final"]["accuracy"]
            assert row["methods"][method]["per_seed"][str(seed)] == pytest.approx(values[method, seed])
    d = [values["fedprox", s] - values["fedavg", s] for s in range(3)]
    mean = sum(d) / 3
    half = T975[2] * math.sqrt(sum((x - mean) ** 2 for x in d) / 2) / math.sqrt(3)
    expected = HOLDS if mean - half > 0 else CONTRADICTED if mean + half < 0 else UNRESOLVED
    text = page.read_text()
    assert text.index("## Findings (computed from the cells)") < text.index("Regenerate every number")
    assert f"- **{expected}**: FedProx is more accurate than FedAvg" in text
    assert f"mean difference {mean:+.2f} over 3 paired seeds" in text
    assert "## Findings" in (out / "reproduce.md").read_text()
    assert load_spec(str(spec)).claims[0].better == "fedprox"
    # Every finished cell left a record beside the page ...
    record = json.loads((tmp_path / "cells" / "table" / "full" / "iid" / "fedprox-seed2.json").read_text())
    assert record["views"]["final"]["accuracy"] == pytest.approx(values["fedprox", 2] / 100)
    assert record["seed"] == 2 and record["command"].startswith("fedhet reproduce")
    # ... so a later reproduction that keeps the row from the page (its runs gone) judges it the same.
    import shutil

    shutil.rmtree(out)
    argv = ["reproduce", str(spec), "--out", str(out), "--quiet", "--page", str(page), "--keep-page-rows"]
    assert main([*argv, "--rows", "no such row"]) == 0
    again = page.read_text()
    assert f"- **{expected}**: FedProx is more accurate than FedAvg" in again
    assert f"mean difference {mean:+.2f} over 3 paired seeds" in again
    # without the records the kept row cannot be judged, and the page says why
    shutil.rmtree(tmp_path / "cells")
    assert main([*argv, "--rows", "no such row"]) == 0
    assert "measured earlier and kept on the page; its per-seed values were not recorded" in page.read_text()


def _one_method_rows(**rows):
    return [{"row": name, "methods": {"celm": {"per_seed": dict(enumerate(v))}}} for name, v in rows.items()]


def test_a_claim_across_two_rows_pairs_one_methods_seeds():
    """d = (85.0 − 84.0, 84.9 − 84.0, 85.2 − 84.1) = (1.0, 0.9, 1.1): mean 1.0, sd 0.1, half-width
    t(0.975, 2) · 0.1 / √3 = 4.3027 · 0.057735 = 0.24841 (by hand): [0.7516, 1.2484], holds."""
    (claim,) = load_claims(
        Path("t"),
        [{"text": "short warm-up wins", "method": "celm", "better_row": ", 5%", "than_row": ", 30%"}],
        ["celm"],
    )
    results = _one_method_rows(
        **{"Dir, 5%": [85.0, 84.9, 85.2], "Dir, 15%": [1, 2, 3], "Dir, 30%": [84.0, 84.0, 84.1]}
    )
    ((_, verdict, (row,)),) = evaluate([claim], results)
    assert verdict == "holds" and row.row == "Dir, 5% vs Dir, 30%" and row.seeds == 3
    assert (row.mean, row.low, row.high) == pytest.approx((1.0, 0.75159, 1.24841), abs=1e-4)
    assert "`celm`: , 5% vs , 30%" in "\n".join(findings_section([claim], results, "points"))
    (ambiguous,) = load_claims(
        Path("t"), [{"text": "x", "method": "celm", "better_row": "Dir", "than_row": "30%"}], ["celm"]
    )
    with pytest.raises(ConfigError, match="'Dir' is part of 3 row names"):
        evaluate([ambiguous], results)
    # a row's whole name picks that row, though it is also part of another's ("Dir, 5%" of "Dir, 5%, long")
    (named,) = load_claims(
        Path("t"), [{"text": "x", "method": "celm", "better_row": "Dir, 5%", "than_row": "30%"}], ["celm"]
    )
    longer = results + _one_method_rows(**{"Dir, 5%, long": [0.0, 0.0, 0.0]})
    ((_, _, (row,)),) = evaluate([named], longer)
    assert row.row == "Dir, 5% vs Dir, 30%" and row.mean == pytest.approx(1.0)


def test_a_claim_across_two_rows_and_two_methods_pairs_each_methods_seeds_on_its_row():
    """An ablation: proxyfl on the full row against fixmatch-gpl on the baseline row. d = (30.0 − 28.0,
    31.0 − 28.5, 29.5 − 28.0) = (2.0, 2.5, 1.5): mean 2.0, sd 0.5, half-width 4.3027 · 0.5 / √3 = 1.24208
    (by hand): [0.7579, 3.2421], holds. The methods' values on the other's row are not read (absent)."""
    (claim,) = load_claims(
        Path("t"),
        [{"text": "both beat GPL", "better": "proxyfl", "than": "fixmatch-gpl", "better_row": "both",
          "than_row": "GPL baseline"}],
        ["fixmatch-gpl", "proxyfl"],
    )  # fmt: skip
    results = [
        {"row": "GPL baseline", "methods": {"fixmatch-gpl": {"per_seed": {"0": 28.0, "1": 28.5, "2": 28.0}}}},
        {"row": "+ GPT", "methods": {"proxyfl": {"per_seed": {"0": 99.0, "1": 99.0, "2": 99.0}}}},
        {"row": "both", "methods": {"proxyfl": {"per_seed": {"0": 30.0, "1": 31.0, "2": 29.5}}}},
    ]
    ((_, verdict, (row,)),) = evaluate([claim], results)
    assert verdict == "holds" and row.row == "both vs GPL baseline" and row.seeds == 3
    assert (row.mean, row.low, row.high) == pytest.approx((2.0, 0.75792, 3.24208), abs=1e-4)
    text = "\n".join(findings_section([claim], results, "points"))
    assert "(`proxyfl` on both vs `fixmatch-gpl` on GPL baseline; 1 of 1 rows measured)" in text
    with pytest.raises(ConfigError, match="needs than_row"):
        load_claims(Path("t"), [{"text": "t", "better": "a", "than": "b", "better_row": "x"}], ["a", "b"])


def test_a_claim_against_a_level_judges_each_row_by_its_distance_to_it():
    """below 1.0: d = 1.0 − value. (0.5, 0.6, 0.55): d = (0.5, 0.4, 0.45), mean 0.45, sd 0.05, half-width
    4.3027 · 0.05 / √3 = 0.12421 (by hand): holds; (1.5, 1.4, 1.45): the mirror image, contradicted;
    above 1.0 on the first: contradicted."""
    results = _one_method_rows(
        **{"N = 5, weight × N": [0.5, 0.6, 0.55], "N = 10, weight × N": [1.5, 1.4, 1.45]}
    )
    below, above = load_claims(
        Path("t"),
        [{"text": "less than a fair share", "method": "celm", "below": 1.0},
         {"text": "more", "method": "celm", "above": 1.0, "rows": ["N = 5"]}],
        ["celm"],
    )  # fmt: skip
    (_, verdict, (five, ten)), (_, above_verdict, (only,)) = evaluate([below, above], results)
    assert (five.verdict, ten.verdict, verdict) == ("holds", "contradicted", "contradicted")
    assert (five.mean, five.low, five.high) == pytest.approx((0.45, 0.32579, 0.57421), abs=1e-4)
    assert (only.verdict, above_verdict) == ("contradicted", "contradicted")
    assert only.mean == pytest.approx(-0.45)


def test_a_claim_takes_one_form():
    for bad in (
        {"text": "t", "method": "celm", "better": "celm", "than": "celm", "below": 1},
        {"text": "t", "method": "celm"},
        {"text": "t", "method": "celm", "above": 1, "below": 2},
        {"text": "t", "method": "celm", "better_row": "a", "than_row": "b", "below": 1},
        {"text": "t", "better": "celm", "than": "celm", "above": 1},
    ):
        with pytest.raises(ConfigError, match="must have one of"):
            load_claims(Path("t"), [bad], ["celm"])
    with pytest.raises(ConfigError, match="method = 'fedavg' is not one of the table's methods"):
        load_claims(Path("t"), [{"text": "t", "method": "fedavg", "below": 1}], ["celm"])


def test_differences_without_spread_are_not_resolved_however_many_seeds_agree():
    """A 0/1 metric identical in every seed gives equal differences: a t-interval needs a spread."""
    assert judge([50.0, 50.0, 50.0, 50.0]) == (UNRESOLVED, None, None)
    (claim,) = load_claims(Path("t"), [{"text": "t", "method": "celm", "above": 50.0}], ["celm"])
    ((_, verdict, (row,)),) = evaluate([claim], _one_method_rows(**{"identified": [100.0, 100.0, 100.0]}))
    assert verdict == UNRESOLVED and row.mean == 50.0 and "no spread" in row.describe()
