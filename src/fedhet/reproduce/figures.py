"""A result page's figures, drawn from a table's runs: curves per round, rewards, contribution weights."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.engine.rundir import is_finished, read_metrics, read_summary, run_name
from fedhet.reproduce.spec import Spec


def _curves(run_dir: Path, method: str, seeds: list[int], metric: str) -> tuple[list[int], np.ndarray] | None:
    """Rounds and the mean over seeds of ``metric`` per evaluated round (metrics.jsonl of each seed's run)."""
    series = []
    for seed in seeds:
        lines = read_metrics(run_dir / run_name(method, seed), missing_ok=True)
        if not lines:
            return None
        series.append({ln["round"]: ln[metric] for ln in lines if isinstance(ln.get(metric), int | float)})
    rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
    if not rounds:
        return None
    return rounds, np.array([[s[r] for r in rounds] for s in series]).mean(axis=0)


def _curves_figure(
    rows: list[dict[str, Any]],
    metric_of: Callable[[dict[str, Any]], str],
    factor: float,
    ylabel: str,
    title: str,
    path: Path,
) -> Path | None:
    """One panel per row: each method's ``metric_of(row)`` (× ``factor``, mean over seeds) per evaluated
    round; None when no run has the metric. Rows that show the same metric of the same runs (one per view)
    share one panel."""
    unique: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        unique.setdefault((r["run_dir"], metric_of(r)), r)
    rows = list(unique.values())
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(rows))
    nrows = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False, constrained_layout=True
    )
    drawn = False
    for ax, r in zip(axes.flat, rows, strict=False):
        for m in r["methods"]:
            curve = _curves(Path(r["run_dir"]), m, r["seeds"], metric_of(r))
            if curve is not None:
                ax.plot(curve[0], factor * curve[1], label=m, linewidth=0.8)
                drawn = True
        ax.set_title(r["row"], fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel or metric_of(r))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    if not drawn:
        plt.close(fig)
        return None
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def accuracy_figure(spec: Spec, results: list[dict[str, Any]], path: Path) -> Path | None:
    """One panel per measured row: each method's test accuracy (mean over seeds) against the round."""
    rows = [r for r in results if r["available"] and r.get("run_dir")]
    title = f"{spec.title}: accuracy over rounds (mean over seeds)"
    return _curves_figure(rows, lambda r: "accuracy", 100, "test accuracy (%)", title, path)


#: Table metrics computed from the clients' reward accuracies against their standalone accuracies.
REWARD_METRICS = ("fairness_pearson", "fairness_spearman", "bcf_rate", "bcf_rate_code", "ipr")


def metric_figure(spec: Spec, results: list[dict[str, Any]], path: Path) -> Path | None:
    """One panel per measured row whose metric is not the test accuracy (the accuracy figure shows that):
    each method's value of the row's metric per evaluated round, mean over seeds. A table that reports the
    best over rounds shows here how far that maximum is above the level a method holds."""
    rows = [r for r in results if r["available"] and r.get("run_dir") and r.get("metric") != "accuracy"]
    title = "the table's metric per evaluated round (mean over seeds)"
    return _curves_figure(rows, lambda r: r["metric"], 1, "", title, path)


def rewards_figure(spec: Spec, results: list[dict[str, Any]], path: Path) -> Path | None:
    """For tables of reward metrics (fairness, rate): one panel per measured row, every client's final
    reward accuracy against its standalone accuracy (what the fairness correlation and the α-BCF bound
    compare), per method, all seeds, with the line reward = standalone."""
    if spec.metric not in REWARD_METRICS:
        return None
    panels: list[tuple[str, str, np.ndarray, np.ndarray]] = []
    for r in results:
        if not (r["available"] and r.get("run_dir")):
            continue
        for m in r["methods"]:
            xs, ys = [], []
            for seed in r["seeds"]:
                run = Path(r["run_dir"]) / run_name(m, seed)
                data = read_summary(run) if is_finished(run) else {}
                if data.get("rewards") and data.get("standalone"):
                    xs += data["standalone"]
                    ys += data["rewards"]
            if xs:
                panels.append((r["row"], m, 100 * np.array(xs, float), 100 * np.array(ys, float)))
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({p[0] for p in panels}, key=[r["row"] for r in results].index)
    methods = list(dict.fromkeys(p[1] for p in panels))
    fig, axes = plt.subplots(
        len(rows),
        len(methods),
        figsize=(2.4 * len(methods), 2.5 * len(rows)),
        squeeze=False,
        constrained_layout=True,
    )
    for i, row in enumerate(rows):
        for j, m in enumerate(methods):
            ax = axes[i][j]
            mine = [p for p in panels if p[0] == row and p[1] == m]
            if not mine:
                ax.axis("off")
                continue
            _, _, x, y = mine[0]
            ax.scatter(x, y, s=10, alpha=0.7)
            low, high = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
            ax.plot([low, high], [low, high], color="grey", linewidth=0.7, linestyle="--")
            ax.set_title(f"{m}" + (f"\n{row}" if j == 0 else ""), fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("standalone %", fontsize=7)
            if j == 0:
                ax.set_ylabel("final reward %", fontsize=7)
            ax.grid(alpha=0.3)
    fig.suptitle("every client's final reward against its standalone accuracy (all seeds)", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def weights_figure(spec: Spec, results: list[dict[str, Any]], path: Path) -> Path | None:
    """Each row's final per-client contribution weights (or reward accuracies), mean over seeds, per method
    that has them (CELM, CGSV, ShapFed; FedRAC, CFFL rewards)."""
    panels = []
    drawn = set()  # rows that share their runs (one per metric or view) draw them once
    for r in results:
        if not (r["available"] and r.get("run_dir")) or r["run_dir"] in drawn:
            continue
        drawn.add(r["run_dir"])
        for m in r["methods"]:
            values = []
            for seed in r["seeds"]:
                run = Path(r["run_dir"]) / run_name(m, seed)
                if is_finished(run):
                    data = read_summary(run)
                    key = (
                        "contributions"
                        if data.get("contributions")
                        else "rewards"
                        if data.get("rewards")
                        else None
                    )
                    if key:
                        values.append((key, data[key]))
            if values and len({k for k, _ in values}) == 1:
                vals = np.array([v for _, v in values], dtype=float)
                panels.append((r["row"], m, values[0][0], np.nanmean(vals, axis=0)))
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({p[0] for p in panels}, key=[r["row"] for r in results].index)
    cols = min(3, len(rows))
    nrows = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False, constrained_layout=True
    )
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    for ax, row in zip(axes.flat, rows, strict=False):
        mine = [p for p in panels if p[0] == row]
        width = 0.8 / len(mine)
        for i, (_, m, key, vals) in enumerate(mine):
            ax.bar(np.arange(len(vals)) + i * width, vals, width, label=f"{m} ({key})")
        ax.set_title(row)
        ax.set_xlabel("client")
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(
        f"{spec.title}: final contribution weights / reward accuracies (mean over seeds)", fontsize=9
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
