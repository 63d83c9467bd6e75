"""Markdown reports with tables and PNG figures from run directories (``fedhet report``)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.engine.names import RunNames
from fedhet.engine.rundir import (
    CONFIG_FILE,
    PARTITION_FILE,
    SUMMARY_FILE,
    is_finished,
    read_metrics,
    read_summary,
)
from fedhet.errors import ConfigError
from fedhet.report.figures import (
    plot_class_counts,
    plot_contributions,
    plot_metric_curves,
    plot_per_class_recall,
    plot_rewards_vs_standalone,
)


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding summary.json) among ``paths`` and one level below (compare directories)."""
    runs: list[Path] = []
    for p in paths:
        if not p.exists():
            raise ConfigError(
                f"{p} does not exist; pass run directories written by `fedhet run`/`fedhet compare`"
            )
        if is_finished(p):
            runs.append(p)
        else:
            runs += sorted(q for q in p.iterdir() if q.is_dir() and is_finished(q))
    if not runs:
        raise ConfigError(f"no run directories (with {SUMMARY_FILE}) found in {[str(p) for p in paths]}")
    return runs


def load_run(run_dir: Path) -> dict[str, Any]:
    metrics = read_metrics(run_dir)
    partition_file = run_dir / PARTITION_FILE
    partition = json.loads(partition_file.read_text()) if partition_file.is_file() else None
    summary = read_summary(run_dir)
    return {
        "dir": run_dir,
        "summary": summary,
        "metrics": metrics,
        "partition": partition,
        # what the tables and figures call the clients and classes (fedhet.engine.names)
        "names": RunNames.of_summary(summary, (partition or {}).get("classes")),
    }


def _label(run: dict[str, Any]) -> str:
    s = run["summary"]
    return f"{s['method']} (seed {s['seed']})"


def _mean_std(vals: list[float]) -> str:
    vals = [v for v in vals if isinstance(v, int | float) and v is not None and math.isfinite(v)]
    if not vals:
        return "—"
    return f"{np.mean(vals):.2f} ± {np.std(vals):.2f}" if len(vals) > 1 else f"{vals[0]:.2f}"


REPORT_METRICS = (
    ("accuracy", "final", 100, "accuracy %"),
    ("accuracy", "best", 100, "best accuracy %"),
    ("balanced_accuracy", "final", 100, "balanced acc. %"),
    ("rare_class_recall", "final", 100, "rare-class recall %"),
    ("fairness_pearson", "final", 1, "fairness ρ×100"),
    ("fairness_pearson", "best", 1, "fairness (best)"),
    ("bcf_rate", "final", 1, "BCF rate"),
    ("contribution_fairness_pearson", "final", 1, "contribution vs standalone ρ×100"),
)


def summary_table(runs: list[dict[str, Any]]) -> str:
    """Markdown table: one row per method, mean ± std over its seeds."""
    methods: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        methods.setdefault(r["summary"]["method"], []).append(r["summary"])
    cols = [c for c in REPORT_METRICS if any(c[0] in s[c[1]] for ss in methods.values() for s in ss)]
    head = "| method | seeds | " + " | ".join(c[3] for c in cols) + " |"
    sep = "|---|---|" + "---|" * len(cols)
    lines = [head, sep]
    for m, ss in methods.items():
        cells = [_mean_std([c[2] * s[c[1]][c[0]] for s in ss if s[c[1]].get(c[0]) is not None]) for c in cols]
        lines.append(f"| {m} | {len(ss)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def class_recall_table(runs: list[dict[str, Any]]) -> str:
    """Markdown table of the final recall of each class (by name), one column per method, mean ± std over
    its seeds; "" when no run recorded per-class recall."""
    methods: dict[str, list[list[float]]] = {}
    for r in runs:
        recall = r["summary"]["final"].get("per_class_recall")
        if recall:
            methods.setdefault(r["summary"]["method"], []).append(recall)
    if not methods:
        return ""
    k = max(len(rows[0]) for rows in methods.values())
    names = runs[0]["names"]
    lines = ["| class | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for c in range(k):
        cells = [
            _mean_std([100 * row[c] for row in rows if c < len(row) and row[c] is not None])
            for rows in methods.values()
        ]
        lines.append(f"| {names.class_name(c)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _link(path: str) -> str:
    """A Markdown link target: angle brackets keep a path with spaces or parentheses one link."""
    return f"<{path}>" if any(ch in path for ch in " ()") else path


def write_report(paths: list[Path], out: str | os.PathLike, title: str | None = None) -> Path:
    """Write a Markdown report (and its figures under ``<out stem>_figures/``) for the given runs."""
    out = Path(out)
    runs = [load_run(p) for p in find_runs([Path(p) for p in paths])]
    fig_dir = out.parent / f"{out.stem}_figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    rel = lambda p: _link(os.path.relpath(p, out.parent))  # noqa: E731
    md = [f"# {title or 'fedhet report'}", ""]
    first = runs[0]
    cfg_file = first["dir"] / CONFIG_FILE
    cfg_text = cfg_file.read_text() if cfg_file.is_file() else ""
    md += [
        f"{len(runs)} run(s): " + ", ".join(f"`{r['dir'].name}`" for r in runs),
        "",
        "## Results (mean ± std over seeds)",
        "",
        summary_table(runs),
        "",
    ]
    md += [
        "Accuracies are in %, fairness is 100 × Pearson correlation of standalone accuracy and reward-model "
        "accuracy (FedRAC's protocol); 'best' is the best value over evaluated rounds.",
        "",
    ]
    recall_table = class_recall_table(runs)
    if recall_table:
        md += ["## Final recall per class (%, mean ± std over seeds)", "", recall_table, ""]
    figures = []
    if plot_metric_curves(runs, "accuracy", fig_dir / "accuracy.png", "test accuracy (%)", 100):
        figures.append(("Test accuracy per round", fig_dir / "accuracy.png"))
    if plot_metric_curves(
        runs, "balanced_accuracy", fig_dir / "balanced_accuracy.png", "balanced accuracy (%)", 100
    ):
        figures.append(("Balanced accuracy per round", fig_dir / "balanced_accuracy.png"))
    if plot_metric_curves(
        runs, "rare_class_recall", fig_dir / "rare_class_recall.png", "rare-class recall (%)", 100
    ):
        figures.append(("Rare-class recall per round", fig_dir / "rare_class_recall.png"))
    if plot_metric_curves(runs, "fairness_pearson", fig_dir / "fairness.png", "fairness (ρ×100)"):
        figures.append(("Fairness per round", fig_dir / "fairness.png"))
    classes = list(first["names"].classes) or None
    if plot_per_class_recall(runs, fig_dir / "per_class_recall.png", classes):
        figures.append(("Final per-class recall (mean over seeds)", fig_dir / "per_class_recall.png"))
    if first["partition"]:
        counts = np.array(first["partition"]["counts"])
        plot_class_counts(
            counts,
            fig_dir / "partition.png",
            title="client × class counts",
            class_names=first["names"].class_labels(counts.shape[1]),
            client_names=first["names"].client_labels(counts.shape[0]),
        )
        figures.append(("Client sizes and class mix (first run)", fig_dir / "partition.png"))
    if plot_rewards_vs_standalone(runs, fig_dir / "rewards.png"):
        figures.append(("Reward-model vs standalone accuracy", fig_dir / "rewards.png"))
    done_contrib = set()
    for r in runs:
        m = r["summary"]["method"]
        if m in done_contrib:
            continue
        p = fig_dir / f"contributions_{m}.png"
        if plot_contributions(r, p):
            figures.append((f"Contribution weights over rounds: {_label(r)}", p))
            done_contrib.add(m)
    for r in runs:  # figures a method wrote into its run directory
        for png in sorted((r["dir"] / "figures").glob("*.png")) if (r["dir"] / "figures").is_dir() else []:
            figures.append((f"{_label(r)}: {png.stem.replace('_', ' ')}", png))
    if figures:
        md += ["## Figures", ""]
        for caption, p in figures:
            md += [f"### {caption}", "", f"![{caption}]({rel(p)})", ""]
    md += ["## Per-run details", ""]
    for r in runs:
        s, names = r["summary"], r["names"]
        md.append(
            f"- `{r['dir'].name}`: {s['method']}, seed {s['seed']}, {s['rounds']} rounds, "
            f"{s.get('wall_time_s', 0):.1f} s"
        )
        if s.get("contributions"):
            md.append(
                "  - contributions: "
                + ", ".join(f"{names.client(i)} {c:.3f}" for i, c in enumerate(s["contributions"]))
            )
        if s.get("rewards"):
            md.append(
                "  - reward accuracies: "
                + ", ".join(
                    f"{names.client(i)} {100 * a:.1f}" for i, a in enumerate(s["rewards"]) if a is not None
                )
            )
    if cfg_text:
        md += ["", "## Configuration (first run)", "", "```toml", cfg_text.strip(), "```", ""]
    out.write_text("\n".join(md) + "\n")
    return out
