"""The robustness page's accuracy targets judged on paired intervals, and its column measured on some rows.

Known answers come from scipy's one-sample t-test (``scipy.stats.ttest_1samp(...).confidence_interval``, a
second implementation of the Student-t interval sharing nothing with fedhet.verdicts) and, in the comments,
by hand with t(0.975, 2) = 4.3027 and t(0.95, 2) = 2.9200 for three seeds.
"""

from __future__ import annotations

import math

import pytest
from scipy import stats

from fedhet.studies import robustness
from fedhet.verdicts import MEETS, MISSES, UNRESOLVED, judge_margin


def _cell(accuracies: dict[int, float], top: float = 0.0) -> dict[str, list]:
    """A collected cell (:func:`fedhet.studies.robustness.collect`'s shape) from seed -> accuracy."""
    seeds = sorted(accuracies)
    return {
        "seed": seeds,
        "accuracy": [accuracies[s] for s in seeds],
        "weight": [0.1] * len(seeds),
        "top": [top] * len(seeds),
        "top_f1": [0.0] * len(seeds),
        "top_f3": [0.0] * len(seeds),
        "honest_rejected": [0] * len(seeds),
        "honest_clipped": [0] * len(seeds),
        "honest_ratio": [1.5] * len(seeds),
        "commit": ["abc1234"] * len(seeds),
        "wall_time_s": [1.0] * len(seeds),
        "machine": [""] * len(seeds),
    }


class _Found(dict):
    """Collected cells; a cell not given is an empty one (nothing measured), as collect() returns it."""

    def __missing__(self, key):
        return _cell({})


def _scipy_interval(changes: list[float]) -> tuple[float, float]:
    ci = stats.ttest_1samp(changes, 0.0).confidence_interval(0.95)
    return float(ci.low), float(ci.high)


# clean accuracies far apart between seeds (70, 80, 90 %): only a pairing by seed sees the changes' spread
CLEAN = {0: 0.70, 1: 0.80, 2: 0.90}
CASES = [
    # changes -0.2, -0.4, -0.6 points: mean -0.4, sd 0.2, half 4.3027 * 0.2 / sqrt(3) = 0.497:
    # [-0.897, +0.097], above -2: meets (an unpaired comparison of 70/80/90 against 69.8/79.6/89.4 straddles)
    ("meets", {0: 0.698, 1: 0.796, 2: 0.894}, 2.0, MEETS),
    # -8, -9, -10 points: mean -9, sd 1, half 2.484: [-11.48, -6.52], below -5: misses
    ("misses", {0: 0.62, 1: 0.71, 2: 0.80}, 5.0, MISSES),
    # -1, -3, +1 points: mean -1 (within 2: the mean alone would say "meets"), sd 2, half 4.968:
    # [-5.97, +3.97] straddles -2: not resolved
    ("straddles, mean inside", {0: 0.69, 1: 0.77, 2: 0.91}, 2.0, UNRESOLVED),
    # -4, -7, -13 points at f = 3: mean -8 (beyond 5: the mean alone would say "misses"), sd 4.58, half 11.38:
    # [-19.4, +3.4] straddles -5: not resolved
    ("straddles, mean outside", {0: 0.66, 1: 0.73, 2: 0.77}, 5.0, UNRESOLVED),
    # -1.25, -0.5, +0.25 points: mean -0.5, sd 0.75: the 95 % interval [-2.363, +1.363] straddles -2 (not
    # resolved), the 90 % one [-1.764, +0.764] and a normal-quantile one (half 1.96 * 0.75 / sqrt(3) = 0.849)
    # would not: the level and the t quantile matter
    ("95 % and t, not 90 % or z", {0: 0.6875, 1: 0.795, 2: 0.9025}, 2.0, UNRESOLVED),
]


@pytest.mark.parametrize(("name", "attacked", "target", "verdict"), CASES, ids=[c[0] for c in CASES])
def test_a_target_is_judged_on_the_paired_95_interval(name, attacked, target, verdict):
    cell, clean = _cell(attacked), _cell(CLEAN)
    changes = [100 * (attacked[s] - CLEAN[s]) for s in sorted(attacked)]
    low, high = _scipy_interval(changes)
    got, mean, got_low, got_high = robustness.drop_verdict(cell, clean, target)
    assert got == verdict
    assert mean == pytest.approx(sum(changes) / 3, abs=1e-9)
    # two implementations of the interval agree to float rounding (both from the same three numbers)
    assert (got_low, got_high) == pytest.approx((low, high), abs=1e-9)


def test_the_hand_computed_intervals_are_the_ones_scipy_gives():
    """The comments' hand arithmetic, checked once against scipy (so the cases above are what they say)."""
    assert _scipy_interval([-0.2, -0.4, -0.6]) == pytest.approx((-0.897, 0.097), abs=1e-3)
    assert _scipy_interval([-8.0, -9.0, -10.0]) == pytest.approx((-11.484, -6.516), abs=1e-3)
    assert _scipy_interval([-1.0, -3.0, 1.0]) == pytest.approx((-5.968, 3.968), abs=1e-3)
    assert _scipy_interval([-4.0, -7.0, -13.0]) == pytest.approx((-19.384, 3.384), abs=1e-3)
    assert _scipy_interval([-1.25, -0.5, 0.25]) == pytest.approx((-2.363, 1.363), abs=1e-3)


def test_changes_are_paired_by_seed_and_one_seed_is_never_resolved():
    # the cell's seed 3 has no clean run: it is left out; seeds 0-2 are the "misses" case above
    cell = _cell({0: 0.62, 1: 0.71, 2: 0.80, 3: 0.99})
    assert robustness.paired_changes(cell, _cell(CLEAN)) == pytest.approx([-8.0, -9.0, -10.0])
    assert robustness.drop_verdict(cell, _cell(CLEAN), 5.0)[0] == MISSES
    # one seed, however far below the target: no interval, not resolved
    verdict, mean, low, high = robustness.drop_verdict(_cell({0: 0.10}), _cell(CLEAN), 5.0)
    assert verdict == UNRESOLVED and mean == pytest.approx(-60.0) and math.isnan(low) and math.isnan(high)
    assert judge_margin([], 2.0)[0] == UNRESOLVED


def test_a_margin_verdict_refuses_what_it_cannot_judge():
    with pytest.raises(ValueError, match="non-finite"):
        judge_margin([-1.0, float("nan"), -2.0], 2.0)
    with pytest.raises(ValueError, match="tolerated loss"):
        judge_margin([-1.0, -2.0], -2.0)


def _partial_found() -> _Found:
    """CELM with the paper's evidence at its three rows (seeds 0-2); the defaults' CELM column clean only."""
    found = _Found()
    column = "CELM, paper's evidence"
    found["clean", column] = _cell(CLEAN)
    found["adaptive-scale/f1", column] = _cell({0: 0.698, 1: 0.796, 2: 0.894})  # meets (above)
    found["adaptive-scale/f3", column] = _cell({0: 0.62, 1: 0.71, 2: 0.80}, top=1.0)  # misses, on top
    found["clean", "CELM"] = _cell(CLEAN)
    return found


#: the rows the paper's-evidence column is given in these tests (the shipped column covers every row)
THREE_ROWS = (("clean", 0), ("adaptive-scale", 1), ("adaptive-scale", 3))


def test_a_variant_measured_on_some_rows_plans_cells_only_in_those(monkeypatch):
    monkeypatch.setitem(robustness.VARIANT_ROWS, "paper-evidence", THREE_ROWS)
    planned = {c.path for c in robustness.cells() if c.path.endswith("/paper-evidence")}
    assert planned == {
        "clean/paper-evidence",
        "adaptive-scale/f1/paper-evidence",
        "adaptive-scale/f3/paper-evidence",
    }
    # every other variant keeps its cells: every row, or the rows VARIANT_ROWS gives it
    others = [c for c in robustness.cells() if not c.path.endswith("/paper-evidence")]
    expected = sum(
        len(robustness.VARIANT_ROWS.get(variant, robustness.ROWS))
        for variant in robustness._variants(1)
        if variant != "paper-evidence"
    )
    assert len(others) == expected


def test_a_column_measured_on_some_rows_is_judged_on_those_and_shows_a_dash_elsewhere(monkeypatch):
    monkeypatch.setitem(robustness.VARIANT_ROWS, "paper-evidence", THREE_ROWS)
    assert robustness.column_rows("CELM, paper's evidence") == THREE_ROWS
    by_path = {cell.path for cell in robustness.cells()}
    assert "adaptive-scale/f3/paper-evidence" in by_path and "noise/f1/paper-evidence" not in by_path
    found = _partial_found()
    line = next(ln for ln in robustness.targets(found) if "**CELM, paper's evidence**" in ln)
    attacked = len(robustness.ROWS) - 1
    assert f"(2 attacked rows measured, of {attacked}: the column covers no other)" in line
    assert (
        "accuracy target met in 1 of 2 attacked rows; missed in adaptive-scale/f3 -9.0 [-11.5, -6.5];" in line
    )
    assert "hostile on top in adaptive-scale/f3 in 3 seed(s)" in line
    assert line.endswith("each change paired over 3 seeds")
    # the defaults' CELM column has a clean run and no attacked row yet
    assert "- **CELM**: not measured yet (no attacked row)" in robustness.targets(found)
    table = robustness.table_lines(found)
    head = table[0].split(" | ")
    column = head.index("CELM, paper's evidence")
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ") for r in table if r.startswith("| ")}
    assert rows["noise/f1"][column] == "–"
    assert rows["adaptive-scale/f1"][column] == "0.10 · 79.6 (-0.4)"
    assert (
        "CELM, paper's evidence: measured on the rows clean, adaptive-scale/f1, adaptive-scale/f3 only "
        "(– elsewhere)."
    ) in table[-1]


def test_the_page_says_which_rule_judges_the_targets_and_over_how_many_seeds(monkeypatch):
    from fedhet.studies.robustness_page import page

    monkeypatch.setitem(robustness.VARIANT_ROWS, "paper-evidence", THREE_ROWS)

    text = page(None, None, None, _partial_found())
    flat = " ".join(text.split())
    assert "not on the seeds' mean: the mean of the n paired changes with its 95 % Student-t interval" in flat
    assert (
        "(n − 1 degrees of freedom; shown as mean [low, high] in points), here over 3 seeds per row" in flat
    )
    assert "A row with one seed has no interval and is never resolved." in flat
    assert "`method.params.evidence_clip = 0`" in flat
    first = 1 + 2 * len(robustness.FIRST_ATTACKS)
    assert (
        f"Flower's three columns and the looser clip are measured on the first {first} of the "
        f"{len(robustness.ROWS)} rows (the attacks built to beat robust rules came later; the table's note "
        "says so)"
    ) in flat
