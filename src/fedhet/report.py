"""Markdown reports with tables and PNG figures from run directories (``fedhet report``)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.errors import ConfigError


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding summary.json) among ``paths`` and one level below (compare directories)."""
    runs: list[Path] = []
    for p in paths:
        if not p.exists():
            raise ConfigError(
                f"{p} does not exist; pass run directories written by `fedhet run`/`fedhet compare`"
            )
        if (p / "summary.json").is_file():
            runs.append(p)
        else:
            runs += sorted(q for q in p.iterdir() if q.is_dir() and (q / "summary.json").is_file())
    if not runs:
        raise ConfigError(f"no run directories (with summary.json) found in {[str(p) for p in paths]}")
    return runs


def load_run(run_dir: Path) -> dict[str, Any]:
    metrics = [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines() if s.strip()]
    partition = (
        json.loads((run_dir / "partition.json").read_text())
        if (run_dir / "partition.json").is_file()
        else None
    )
    return {
        "dir": run_dir,
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "metrics": metrics,
        "partition": partition,
    }


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(run: dict[str, Any], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for line in run["metrics"]:
        v = line.get(key)
        if isinstance(v, int | float) and v is not None and math.isfinite(v):
            xs.append(line["round"])
            ys.append(v)
    return xs, ys


def _label(run: dict[str, Any]) -> str:
    s = run["summary"]
    return f"{s['method']} (seed {s['seed']})"


#: Curves with more evaluations than this are smoothed by a moving average of len // MAX_POINTS of them.
MAX_POINTS = 100


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` consecutive entries of the last axis (length shrinks by window − 1)."""
    if window <= 1:
        return values
    c = np.cumsum(np.asarray(values, dtype=float), axis=-1)
    c = np.concatenate([np.zeros(c.shape[:-1] + (1,)), c], axis=-1)
    return (c[..., window:] - c[..., :-window]) / window


def method_curves(runs: list[dict[str, Any]], key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per method: the rounds every one of its runs evaluated ``key`` at, and a (seeds, rounds) array."""
    by_method: dict[str, list[dict[int, float]]] = {}
    for r in runs:
        xs, ys = _series(r, key)
        if xs:
            by_method.setdefault(r["summary"]["method"], []).append(dict(zip(xs, ys, strict=True)))
    out = {}
    for m, series in by_method.items():
        rounds = sorted(set.intersection(*(set(s) for s in series)))
        if rounds:
            out[m] = (np.array(rounds), np.array([[s[x] for x in rounds] for s in series], dtype=float))
    return out


def plot_metric_curves(
    runs: list[dict[str, Any]], key: str, path: Path, ylabel: str, scale: float = 1.0
) -> bool:
    """Metric ``key`` over rounds, one line per method: the mean over its seeds, with the seeds' min–max
    as a band; more than MAX_POINTS evaluations are smoothed by a moving average (said in the title)."""
    curves = method_curves(runs, key)
    if not curves:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    longest = max(len(xs) for xs, _ in curves.values())
    window = max(1, longest // MAX_POINTS)
    for i, (m, (xs, ys)) in enumerate(sorted(curves.items())):
        colour = plt.cm.tab10(i % 10)
        w = min(window, len(xs))
        xs, ys = xs[w - 1 :], moving_average(scale * ys, w)
        label = m if len(ys) == 1 else f"{m} ({len(ys)} seeds)"
        ax.plot(xs, ys.mean(axis=0), color=colour, lw=1.5, label=label)
        if len(ys) > 1:
            ax.fill_between(xs, ys.min(axis=0), ys.max(axis=0), color=colour, alpha=0.15, lw=0)
    parts = ["mean over seeds, band: min–max"] if any(len(ys) > 1 for _, ys in curves.values()) else []
    if window > 1:
        parts.append(f"moving average of {window} evaluations")
    if parts:
        ax.set_title("; ".join(parts), fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, framealpha=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_per_class_recall(runs: list[dict[str, Any]], path: Path, class_names: list[str] | None) -> bool:
    """Final per-class recall, mean over seeds, one bar group per class."""
    by_method: dict[str, list[list[float]]] = {}
    for r in runs:
        pcr = r["summary"]["final"].get("per_class_recall")
        if pcr:
            by_method.setdefault(r["summary"]["method"], []).append([np.nan if v is None else v for v in pcr])
    if not by_method:
        return False
    plt = _plt()
    k = len(next(iter(by_method.values()))[0])
    fig, ax = plt.subplots(figsize=(max(6.5, 0.6 * k * max(1, len(by_method)) / 2), 4))
    width = 0.8 / len(by_method)
    for i, (m, rows) in enumerate(sorted(by_method.items())):
        mean = np.nanmean(np.array(rows, dtype=float), axis=0)
        ax.bar(np.arange(k) + i * width - 0.4 + width / 2, 100 * mean, width, label=m)
    ax.set_xticks(np.arange(k))
    ax.set_xticklabels(
        class_names[:k] if class_names else [str(c) for c in range(k)], rotation=45, ha="right"
    )
    ax.set_ylabel("recall (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_contributions(run: dict[str, Any], path: Path) -> bool:
    """Contribution weights per client over rounds."""
    rounds, rows = [], []
    for line in run["metrics"]:
        c = line.get("contributions")
        if c:
            rounds.append(line["round"])
            rows.append(c)
    if not rows:
        return False
    plt = _plt()
    arr = np.array(rows, dtype=float)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    info = run["summary"].get("partition_info") or {}
    special = set(info.get("maverick_clients", []) or [])
    fr = info.get("free_rider")
    for i in range(arr.shape[1]):
        style = "-"
        label = f"client {i}"
        if i in special:
            label += " (maverick)"
            style = "--"
        if fr is not None and i == fr:
            label += " (free rider)"
            style = ":"
        ax.plot(rounds, arr[:, i], style, label=label, lw=1.6)
    ax.axhline(1 / arr.shape[1], color="gray", lw=0.8, ls="-.", label="1/N")
    ax.set_xlabel("round")
    ax.set_ylabel("contribution weight")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_rewards_vs_standalone(runs: list[dict[str, Any]], path: Path, alpha: float = 0.5) -> bool:
    """Reward-model accuracy against standalone accuracy per client (one marker per method)."""
    pts = [
        (r["summary"]["method"], r["summary"].get("standalone"), r["summary"].get("rewards")) for r in runs
    ]
    pts = [(m, s, a) for m, s, a in pts if s and a and all(v is not None for v in a)]
    if not pts:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    lo = min(min(s) for _, s, _ in pts)
    hi = max(max(a + s) for _, s, a in pts)
    for m, s, a in pts:
        ax.scatter(100 * np.array(s), 100 * np.array(a), label=m, s=22, alpha=0.8)
    ax.plot([100 * lo, 100 * hi], [100 * lo, 100 * hi], color="gray", lw=0.8, label="reward = standalone")
    ax.set_xlabel("standalone accuracy (%)")
    ax.set_ylabel("reward-model accuracy (%)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


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


def write_report(paths: list[Path], out: str | os.PathLike, title: str | None = None) -> Path:
    """Write a Markdown report (and its figures under ``<out stem>_figures/``) for the given runs."""
    out = Path(out)
    runs = [load_run(p) for p in find_runs([Path(p) for p in paths])]
    fig_dir = out.parent / f"{out.stem}_figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    rel = lambda p: os.path.relpath(p, out.parent)  # noqa: E731
    md = [f"# {title or 'fedhet report'}", ""]
    first = runs[0]
    cfg_text = (first["dir"] / "config.toml").read_text() if (first["dir"] / "config.toml").is_file() else ""
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
    classes = first["partition"]["classes"] if first["partition"] else None
    if plot_per_class_recall(runs, fig_dir / "per_class_recall.png", classes):
        figures.append(("Final per-class recall (mean over seeds)", fig_dir / "per_class_recall.png"))
    if first["partition"]:
        from fedhet.plotting import plot_class_counts

        counts = np.array(first["partition"]["counts"])
        plot_class_counts(
            counts, fig_dir / "partition.png", title="client × class counts", class_names=classes
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
        s = r["summary"]
        md.append(
            f"- `{r['dir'].name}`: {s['method']}, seed {s['seed']}, {s['rounds']} rounds, "
            f"{s.get('wall_time_s', 0):.1f} s"
        )
        if s.get("contributions"):
            md.append("  - contributions: " + ", ".join(f"{c:.3f}" for c in s["contributions"]))
        if s.get("rewards"):
            md.append(
                "  - reward accuracies: " + ", ".join(f"{100 * a:.1f}" for a in s["rewards"] if a is not None)
            )
    if cfg_text:
        md += ["", "## Configuration (first run)", "", "```toml", cfg_text.strip(), "```", ""]
    out.write_text("\n".join(md) + "\n")
    return out
