"""The robustness page's trade-off: each column's clean cost against FedAvg and its worst attacked change,
checked on hand-made cells with answers computed by hand."""

from __future__ import annotations

import pytest

from fedhet.studies import robustness_tradeoff as tradeoff


def _cell(accuracies: dict[int, float]) -> dict[str, list]:
    seeds = sorted(accuracies)
    return {"seed": seeds, "accuracy": [accuracies[s] for s in seeds]}


class _Found(dict):
    def __missing__(self, key):
        return _cell({})


def _found() -> _Found:
    found = _Found()
    found["clean", "FedAvg"] = _cell({0: 0.80, 1: 0.90, 2: 0.70})
    # "+ median": clean 78 / 87 / 70 -> costs -2, -3, 0: mean -5 / 3 = -1.667 (paired by seed; an unpaired
    # difference of the means is the same here, so seed 2 alone is checked below)
    found["clean", "+ median"] = _cell({0: 0.78, 1: 0.87, 2: 0.70})
    # f = 1: noise -1 / -1 / -1 (mean -1), sign-flip -4 / -6 / -2 (mean -4): the worst is sign-flip, -4
    found["noise/f1", "+ median"] = _cell({0: 0.77, 1: 0.86, 2: 0.69})
    found["sign-flip/f1", "+ median"] = _cell({0: 0.74, 1: 0.81, 2: 0.68})
    # f = 3: ipm at seed 0 only, -10
    found["ipm/f3", "+ median"] = _cell({0: 0.68})
    # a Flower column is the same rule again: left out
    found["clean", "Flower FedMedian"] = _cell({0: 0.78})
    # CELM measured at seed 2 only: its clean cost pairs seed 2 with FedAvg's seed 2 (72 - 70 = +2), not with
    # FedAvg's mean over three seeds (72 - 80 = -8)
    found["clean", "CELM"] = _cell({2: 0.72})
    return found


def test_clean_cost_is_paired_by_seed_and_the_worst_attack_is_the_most_negative_mean_change():
    points = {p.column: p for p in tradeoff.points(_found())}
    assert set(points) == {"FedAvg", "+ median", "CELM"}  # measured columns only, Flower's left out
    median = points["+ median"]
    assert median.clean_cost == pytest.approx(-5 / 3)
    assert median.worst[1] == ("sign-flip", pytest.approx(-4.0))
    assert median.worst[3] == ("ipm", pytest.approx(-10.0))
    assert median.rows == 3
    assert points["CELM"].clean_cost == pytest.approx(2.0)
    assert points["CELM"].worst == {} and points["FedAvg"].clean_cost == 0.0
    lines = tradeoff.tradeoff_lines(_found())
    assert "| + median (3 attacked rows) | -1.67 | -4.0 (sign-flip) | -10.0 (ipm) |" in lines
    assert "| CELM (0 attacked rows) | +2.00 | – | – |" in lines


def test_the_tradeoff_figure_is_drawn(tmp_path):
    path = tradeoff.draw_tradeoff(_found(), tmp_path / "tradeoff.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
