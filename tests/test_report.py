"""Known answers for the report's curve aggregation (mean over seeds, min–max band, moving average)."""

from __future__ import annotations

import numpy as np

from fedhet.report.figures import method_curves, moving_average, plot_metric_curves


def _run(method: str, seed: int, values: dict[int, float]) -> dict:
    metrics = [{"round": r, "accuracy": v} for r, v in values.items()]
    metrics.append({"round": 99})  # a round without the metric is skipped
    return {"summary": {"method": method, "seed": seed}, "metrics": metrics}


def test_moving_average_known_answer():
    np.testing.assert_allclose(moving_average(np.array([[1.0, 2, 3, 4, 5]]), 2), [[1.5, 2.5, 3.5, 4.5]])
    np.testing.assert_allclose(moving_average(np.array([1.0, 2, 3, 6]), 3), [2.0, 11 / 3])
    np.testing.assert_array_equal(moving_average(np.array([4.0, 5.0]), 1), [4.0, 5.0])


def test_method_curves_align_seeds_on_common_rounds():
    runs = [
        _run("a", 0, {5: 0.1, 10: 0.2, 15: 0.3}),
        _run("a", 1, {5: 0.3, 10: 0.4}),  # stopped early: only rounds both seeds have are kept
        _run("b", 0, {5: 0.9}),
    ]
    curves = method_curves(runs, "accuracy")
    rounds, values = curves["a"]
    np.testing.assert_array_equal(rounds, [5, 10])
    np.testing.assert_allclose(values, [[0.1, 0.2], [0.3, 0.4]])
    np.testing.assert_array_equal(curves["b"][0], [5])
    assert method_curves(runs, "fairness_pearson") == {}


def test_plot_metric_curves_writes_a_figure_or_says_nothing_to_draw(tmp_path):
    runs = [_run("a", s, {r: 0.5 + 0.001 * r * (s + 1) for r in range(1, 301)}) for s in range(2)]
    assert plot_metric_curves(runs, "accuracy", tmp_path / "acc.png", "accuracy (%)", 100)
    assert (tmp_path / "acc.png").stat().st_size > 1000
    assert not plot_metric_curves(runs, "fairness_pearson", tmp_path / "none.png", "fairness")
    assert not (tmp_path / "none.png").exists()
