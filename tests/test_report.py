"""Known answers for the report's curve aggregation (mean over seeds, min–max band, moving average)."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_html_report_is_self_contained_and_holds_the_markdown_tables_and_figures(tmp_path, monkeypatch):
    import base64
    import re
    from html.parser import HTMLParser

    from fedhet.cli import main

    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "cmp"
    argv = ["compare", "--methods", "fedavg,celm", "--dataset", "digits", "--clients", "3", "--rounds", "2",
            "--model", "mlp", "--out", str(out), "--quiet", "--no-report"]  # fmt: skip
    assert main(argv) == 0
    report = tmp_path / "my report.md"  # a space in the name: the figure links must survive it
    assert main(["report", str(out), "--out", str(report), "--html"]) == 0
    page = (tmp_path / "my report.html").read_text()
    markdown = report.read_text()

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.images, self.links, self.tags, self.cells = [], [], [], []
            self._cell = None

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            attrs = dict(attrs)
            if tag == "img":
                self.images.append(attrs["src"])
            if tag in ("a", "link", "script"):
                self.links.append(attrs)
            if tag in ("td", "th"):
                self._cell = ""

        def handle_data(self, data):
            if self._cell is not None:
                self._cell += data

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.cells.append(self._cell)
                self._cell = None

    parsed = Collect()
    parsed.feed(page)
    figures = re.findall(r"^!\[", markdown, flags=re.M)
    assert len(parsed.images) == len(figures) >= 4  # accuracy, per-class recall, partition, CELM weights...
    for src in parsed.images:  # every figure embedded as a real PNG, nothing linked
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert parsed.links == [] and "_figures/" not in page  # no path to the figure folder remains
    assert {"fedavg", "celm"} <= {c.strip() for c in parsed.cells}  # the results table's method rows
    assert parsed.tags.count("h1") == 1 and "pre" in parsed.tags  # the title; the config block


def _drawn(monkeypatch, plot, *args) -> list:
    """The axes of the figure ``plot(*args)`` saves (the PNG is still written)."""
    from fedhet.report import figures

    saved = []
    original = figures.save_figure

    def keep(fig, path):
        saved.append(fig)
        return original(fig, path)

    monkeypatch.setattr(figures, "save_figure", keep)
    assert plot(*args)
    [fig] = saved
    return fig.axes


@pytest.mark.parametrize("rounds", [1, 3, 20, 300])
def test_curves_read_at_any_length_markers_when_few_points_integer_rounds_tied_curves_apart(
    tmp_path, monkeypatch, rounds
):
    from matplotlib.ticker import MaxNLocator

    # two methods with equal curves (a tie) and a third apart
    values = {r: 0.3 + 0.5 * r / rounds for r in range(1, rounds + 1)}
    runs = [_run("a", 0, values), _run("b", 0, values), _run("c", 0, {r: v / 2 for r, v in values.items()})]
    [ax] = _drawn(
        monkeypatch, plot_metric_curves, runs, "accuracy", tmp_path / f"acc{rounds}.png", "acc", 100
    )
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert [ln.get_label() for ln in lines] == ["a", "b", "c"]
    markers = [ln.get_marker() for ln in lines]
    if rounds <= 20:  # every point marked: a 1-round run is a dot, not an invisible line
        assert all(m not in (None, "None", "", " ") for m in markers) and len(set(markers)) == 3
    else:
        assert all(m in (None, "None", "", " ") for m in markers)
    tied = lines[:2]
    assert tied[0].get_linestyle() != tied[1].get_linestyle()  # the tie stays visible: two styles
    assert tied[0].get_linewidth() > tied[1].get_linewidth()  # the one drawn first shows at the sides
    locator = ax.xaxis.get_major_locator()
    assert isinstance(locator, MaxNLocator) and locator._integer
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert (tmp_path / f"acc{rounds}.png").stat().st_size > 1000


def test_round_figures_of_a_run_use_integer_rounds_and_markers(tmp_path, monkeypatch):
    from fedhet.report.figures import plot_contributions, plot_fairness_rounds, plot_round_series

    run = {
        "summary": {"method": "celm"},
        "metrics": [{"round": r, "contributions": [0.5, 0.5]} for r in (1, 2, 3)],
    }
    lines = [{"round": r, "fairness_pearson": 50.0, "bcf_rate": 0.5, "bcf_rate_code": 0.5} for r in (1, 2)]
    series = {"x": [(1, 0.1), (2, 0.2)], "y": [(1, 0.1), (2, 0.2)]}
    for plot, args in (
        (plot_contributions, (run, tmp_path / "c.png")),
        (plot_fairness_rounds, (lines, {}, tmp_path / "f.png", "t")),
        (plot_round_series, (series, tmp_path / "s.png", "t", "y")),
    ):
        for ax in _drawn(monkeypatch, plot, *args):
            assert ax.xaxis.get_major_locator()._integer, plot.__name__
            drawn = [
                ln for ln in ax.get_lines() if len(ln.get_xdata()) > 0 and ln.get_marker() not in ("None", "")
            ]
            assert drawn, plot.__name__
        monkeypatch.undo()
