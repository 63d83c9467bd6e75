"""The estimator-cost benchmark's arithmetic: medians over interleaved passes and ratios to FedAvg's median
(the benchmark itself is the measurement; nothing here is timed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import estimator_cost  # noqa: E402


def test_costs_are_medians_divided_by_fedavgs_median():
    # By hand: FedAvg's passes 2.0, 9.0 (a loaded pass), 1.0 -> median 2.0; CELM's 3.0, 5.0, 4.0, 100.0
    # (even count: the mean of the middle two, 4.5) -> 4.5 / 2.0 = 2.25; exact 20.0 alone -> 10.
    times = {"fedavg": [2.0, 9.0, 1.0], "celm": [3.0, 5.0, 4.0, 100.0], "exact_shapley": [20.0]}
    rows = {r["estimator"]: r for r in estimator_cost.cost_table(times)}
    assert rows["fedavg"]["cost_x_fedavg"] == pytest.approx(1.0)
    assert rows["celm"]["median_s"] == pytest.approx(4.5)
    assert rows["celm"]["cost_x_fedavg"] == pytest.approx(2.25)
    assert (rows["celm"]["min_s"], rows["celm"]["max_s"]) == (3.0, 100.0)
    assert rows["exact_shapley"]["cost_x_fedavg"] == pytest.approx(10.0)


def test_a_cost_without_the_unit_is_refused():
    with pytest.raises(ValueError, match="unit 'fedavg'"):
        estimator_cost.cost_table({"celm": [1.0]})
    with pytest.raises(ValueError, match="no timings of 'celm'"):
        estimator_cost.cost_table({"fedavg": [1.0], "celm": []})


def test_every_timed_entry_is_described_and_the_benchmark_is_in_make_bench():
    import run_all

    assert set(estimator_cost.ENTRIES) == {*estimator_cost.METHODS, *estimator_cost.RECONSTRUCTED} | {
        "standalone",
        "exact_shapley",
    }
    assert "estimator_cost" in {b.name for b in run_all.BENCHES}
