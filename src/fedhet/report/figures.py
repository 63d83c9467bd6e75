"""Every figure fedhet draws: PNGs on matplotlib's Agg canvas (no display, no pyplot state).

One helper makes the figures (:func:`new_figure`) and one saves them (:func:`save_figure`). The plots take
plain values read from run directories (``metrics.jsonl``, ``summary.json``, ``records.json``,
``partition.json``) and return whether they drew anything.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.engine.names import RunNames


def new_figure(width: float = 6.5, height: float = 4.0, dpi: int = 100):
    """A matplotlib Figure of ``width`` × ``height`` inches on the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Lay the figure out tightly and write it as a PNG at ``path`` (creating its folder)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, format="png")
    return out


def colormap(name: str):
    """A matplotlib colormap by name (``tab10``, ``viridis``)."""
    import matplotlib

    return matplotlib.colormaps[name]


#: A curve with at most this many points marks each point (one evaluation is a dot, not an invisible line).
MARKER_POINTS = 20
#: Line styles and markers cycled per curve, so that curves which coincide (tied methods) stay visible.
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def curve_style(i: int, points: int) -> dict[str, Any]:
    """Matplotlib ``plot`` keywords for the ``i``-th curve of a plot, ``points`` long: its own line style,
    and below MARKER_POINTS its own hollow marker (a later curve on top of an equal one leaves it visible)."""
    style: dict[str, Any] = {"ls": LINE_STYLES[i % len(LINE_STYLES)]}
    if points <= MARKER_POINTS:
        style.update(marker=MARKERS[i % len(MARKERS)], ms=8 - 2 * min(i, 2), mfc="none", mew=1.2)
    return style


def integer_rounds(ax: Any) -> None:
    """Round numbers on the x axis: integer ticks only (no round 2.5 in a 3-round run), at least one."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


# --------------------------------------------------------------------------------------------------------
# Partitions
# --------------------------------------------------------------------------------------------------------
#: Annotate each cell with its count when the matrix has at most this many cells.
MAX_ANNOTATED_CELLS = 400


def plot_class_counts(
    counts: np.ndarray,
    path: str | os.PathLike,
    title: str | None = None,
    class_names: Sequence[str] | None = None,
    client_names: Sequence[str] | None = None,
) -> None:
    """Client × class heatmap of a partition's (N, K) class-count matrix, saved as a PNG at ``path``.

    Counts are written into the cells when the matrix is small (<= 400 cells); the clients (``client_names``:
    ``1 (south)``, else their numbers) with their row totals label the y axis.
    """
    matrix = np.asarray(counts)
    if matrix.ndim != 2:
        raise ValueError(f"counts must be a 2-D (clients × classes) matrix, got shape {matrix.shape}")
    n_clients, n_classes = matrix.shape
    if class_names is not None and len(class_names) != n_classes:
        raise ValueError(
            f"class_names has {len(class_names)} names for {n_classes} classes; give one per class"
        )
    names = list(class_names) if class_names is not None else [str(k) for k in range(n_classes)]

    width = min(4.0 + 0.6 * n_classes, 30.0)
    height = min(2.0 + 0.4 * n_clients, 30.0)
    fig = new_figure(width, height)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(matrix, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client: total samples")
    if n_classes <= 60:
        ax.set_xticks(range(n_classes))
        ax.set_xticklabels(names, rotation=45 if max(len(s) for s in names) > 3 else 0, ha="right")
    if n_clients <= 60:
        totals = matrix.sum(axis=1)
        ax.set_yticks(range(n_clients))
        clients = list(client_names) if client_names is not None else [str(i) for i in range(n_clients)]
        ax.set_yticklabels([f"{c}: {int(t)}" for c, t in zip(clients, totals, strict=False)])
    if matrix.size <= MAX_ANNOTATED_CELLS:
        # Dark text on the bright end of viridis, light text elsewhere, so every number stays readable.
        top = float(matrix.max()) if matrix.size else 0.0
        for i in range(n_clients):
            for k in range(n_classes):
                value = matrix[i, k]
                color = "black" if top > 0 and value > 0.6 * top else "white"
                ax.text(k, i, f"{int(value)}", ha="center", va="center", fontsize=7, color=color)
    ax.set_title(title if title is not None else f"class counts ({n_clients} clients × {n_classes} classes)")
    save_figure(fig, path)


# --------------------------------------------------------------------------------------------------------
# Curves and bars over runs (fedhet report)
# --------------------------------------------------------------------------------------------------------
def _series(run: dict[str, Any], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for line in run["metrics"]:
        v = line.get(key)
        if isinstance(v, int | float) and v is not None and math.isfinite(v):
            xs.append(line["round"])
            ys.append(v)
    return xs, ys


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
    fig = new_figure(6.5, 4, dpi=120)
    ax = fig.add_subplot(1, 1, 1)
    longest = max(len(xs) for xs, _ in curves.values())
    window = max(1, longest // MAX_POINTS)
    for i, (m, (xs, ys)) in enumerate(sorted(curves.items())):
        colour = colormap("tab10")(i % 10)
        w = min(window, len(xs))
        xs, ys = xs[w - 1 :], moving_average(scale * ys, w)
        label = m if len(ys) == 1 else f"{m} ({len(ys)} seeds)"
        # earlier curves drawn wider, so a later equal one (tied methods) leaves them visible at its sides
        width = 2.6 - 0.5 * min(i, 3)
        ax.plot(xs, ys.mean(axis=0), color=colour, lw=width, label=label, **curve_style(i, len(xs)))
        if len(ys) > 1:
            ax.fill_between(xs, ys.min(axis=0), ys.max(axis=0), color=colour, alpha=0.15, lw=0)
    parts = ["mean over seeds, band: min–max"] if any(len(ys) > 1 for _, ys in curves.values()) else []
    if window > 1:
        parts.append(f"moving average of {window} evaluations")
    if parts:
        ax.set_title("; ".join(parts), fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    integer_rounds(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, framealpha=0.8)
    save_figure(fig, path)
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
    k = len(next(iter(by_method.values()))[0])
    fig = new_figure(max(6.5, 0.6 * k * max(1, len(by_method)) / 2), 4, dpi=120)
    ax = fig.add_subplot(1, 1, 1)
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
    save_figure(fig, path)
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
    arr = np.array(rows, dtype=float)
    fig = new_figure(6.5, 4, dpi=120)
    ax = fig.add_subplot(1, 1, 1)
    info = run["summary"].get("partition_info") or {}
    special = set(info.get("maverick_clients", []) or [])
    fr = info.get("free_rider")
    names = run.get("names") or RunNames()
    for i in range(arr.shape[1]):
        style = "-"
        label = f"client {names.client(i)}"
        if i in special:
            label += " (maverick)"
            style = "--"
        if fr is not None and i == fr:
            label += " (free rider)"
            style = ":"
        marker = curve_style(i, len(rounds))
        marker.pop("ls")
        ax.plot(rounds, arr[:, i], style, label=label, lw=1.6, **marker)
    ax.axhline(1 / arr.shape[1], color="gray", lw=0.8, ls="-.", label="1/N")
    integer_rounds(ax)
    ax.set_xlabel("round")
    ax.set_ylabel("contribution weight")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return True


def plot_rewards_vs_standalone(runs: list[dict[str, Any]], path: Path, alpha: float = 0.5) -> bool:
    """Reward-model accuracy against standalone accuracy per client (one marker per method)."""
    pts = [
        (r["summary"]["method"], r["summary"].get("standalone"), r["summary"].get("rewards")) for r in runs
    ]
    pts = [(m, s, a) for m, s, a in pts if s and a and all(v is not None for v in a)]
    if not pts:
        return False
    fig = new_figure(5.5, 5, dpi=120)
    ax = fig.add_subplot(1, 1, 1)
    lo = min(min(s) for _, s, _ in pts)
    hi = max(max(a + s) for _, s, a in pts)
    for m, s, a in pts:
        ax.scatter(100 * np.array(s), 100 * np.array(a), label=m, s=22, alpha=0.8)
    ax.plot([100 * lo, 100 * hi], [100 * lo, 100 * hi], color="gray", lw=0.8, label="reward = standalone")
    ax.set_xlabel("standalone accuracy (%)")
    ax.set_ylabel("reward-model accuracy (%)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return True


# --------------------------------------------------------------------------------------------------------
# CELM: contribution weights and evidence
# --------------------------------------------------------------------------------------------------------
ROLE_COLORS = {"free_rider": "tab:red", "maverick": "tab:orange", "other": "tab:blue"}


def _role_of(cid: int, roles: Mapping[str, list[int]]) -> str:
    for role in ("free_rider", "maverick"):
        if cid in roles.get(role, []):
            return role
    return "other"


def plot_contribution_history(
    history: Sequence[tuple[int, Sequence[float]]],
    warmup: int,
    roles: Mapping[str, list[int]],
    path: Path,
    title: str = "CELM contribution weights over rounds",
    ylabel: str = "contribution weight c_i",
    names: RunNames | None = None,
) -> bool:
    """Contribution weights c_i^t over rounds (warm-up shaded; free riders and mavericks coloured; clients
    as ``names`` writes them)."""
    if not history:
        return False
    rounds = np.array([r for r, _ in history])
    c = np.array([v for _, v in history])
    n = c.shape[1]
    fig = new_figure(7.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    if warmup:
        ax.axvspan(0.5, warmup + 0.5, color="0.9", label=f"warm-up (T_w = {warmup})")
    for i in range(n):
        role = _role_of(i, roles)
        style = {"color": ROLE_COLORS[role], "lw": 2.0} if role != "other" else {"lw": 1.0, "alpha": 0.7}
        label = f"client {(names or RunNames()).client(i)}" + (
            "" if role == "other" else f" ({role.replace('_', '-')})"
        )
        ax.plot(rounds, c[:, i], label=label, **style, **curve_style(i, len(rounds)))
    ax.axhline(1.0 / n, color="k", ls="--", lw=0.8, label="1/N")
    integer_rounds(ax)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2 if n > 6 else 1, loc="best")
    save_figure(fig, path)
    return True


def plot_evidence_heatmap(
    record: Mapping[str, Any], roles: Mapping[str, list[int]], path: Path, names: RunNames | None = None
) -> bool:
    """Client × class heatmaps of one warm-up round: raw q̃ (and the global row), q = max(0, q̃ − b)."""
    raw, q = np.asarray(record["raw"]), np.asarray(record["debiased"])
    n, k = raw.shape
    names = names or RunNames()
    labels = [
        names.client(i) + {"free_rider": " FR", "maverick": " MV", "other": ""}[_role_of(i, roles)]
        for i in range(n)
    ]
    fig = new_figure(min(4.0 + 1.0 * k, 26.0), min(2.5 + 0.35 * (n + 1), 20.0))
    panels = (
        (
            np.vstack([np.asarray(record["global"])[None], raw]),
            ["global"] + labels,
            "raw evidence q̃ (max logit)",
        ),
        (q, labels, f"de-biased q = max(0, q̃ − b), b = {_fmt_baseline(record['baseline'])}"),
    )
    for j, (mat, ylabels, title) in enumerate(panels):
        ax = fig.add_subplot(1, 2, j + 1)
        image = ax.imshow(np.ma.masked_invalid(mat), aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(image, ax=ax)
        ax.set_xticks(range(k))
        tilt = {"rotation": 45, "ha": "right"} if k > 3 else {"rotation": 0, "ha": "center"}
        ax.set_xticklabels(names.class_labels(k), **tilt)
        ax.set_xlabel("class")
        ax.set_yticks(range(len(ylabels)))
        ax.set_yticklabels(ylabels, fontsize=7)
        ax.set_title(title, fontsize=8)
        if mat.size <= 400:
            top = np.nanmax(mat) if np.isfinite(mat).any() else 0.0
            for (r, col), v in np.ndenumerate(mat):
                if np.isfinite(v):
                    color = "black" if top > 0 and v > 0.6 * top else "white"
                    ax.text(
                        col,
                        r,
                        f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}",
                        ha="center",
                        va="center",
                        fontsize=6,
                        color=color,
                    )
    fig.suptitle(f"CELM evidence, round {record['round']} (FR = free rider, MV = maverick)", fontsize=9)
    save_figure(fig, path)
    return True


def _fmt_baseline(baseline: np.ndarray) -> str:
    b = np.asarray(baseline)
    return f"{float(b.flat[0]):.2f}" if b.size and np.allclose(b, b.flat[0]) else "b_c per class"


def plot_final_weights(
    contribution: np.ndarray, roles: Mapping[str, list[int]], path: Path, names: RunNames | None = None
) -> bool:
    """Bar chart of the final (frozen) weights with 1/N (FedAvg's equal share); roles coloured."""
    c = np.asarray(contribution)
    if c.size == 0:
        return False
    n = c.size
    fig = new_figure(max(4.0, 0.6 * n + 2.0), 3.5)
    ax = fig.add_subplot(1, 1, 1)
    colors = [ROLE_COLORS[_role_of(i, roles)] for i in range(n)]
    ax.bar(range(n), c, color=colors)
    ax.axhline(1.0 / n, color="k", ls="--", lw=0.8)
    ax.set_xticks(range(n))
    ax.set_xticklabels((names or RunNames()).client_labels(n), rotation=45 if names and names.clients else 0)
    ax.set_xlabel("client")
    ax.set_ylabel("final weight c_i")
    from matplotlib.patches import Patch

    handles = [
        Patch(color=ROLE_COLORS[r], label=r.replace("_", "-"))
        for r in ("free_rider", "maverick")
        if roles.get(r)
    ]
    handles.append(Patch(color=ROLE_COLORS["other"], label="other"))
    from matplotlib.lines import Line2D

    handles.append(Line2D([0], [0], color="k", ls="--", lw=0.8, label="1/N"))
    ax.legend(handles=handles, fontsize=7)
    ax.set_title("CELM final contribution weights")
    save_figure(fig, path)
    return True


# --------------------------------------------------------------------------------------------------------
# Submodels (FedRAC, FedSAC): rewards, unit frequency, fairness, mask sizes
# --------------------------------------------------------------------------------------------------------
def plot_rewards_scatter(
    standalone: Sequence[float],
    rewards: Sequence[float | None],
    alpha: float,
    path: Path,
    title: str,
    names: RunNames | None = None,
) -> bool:
    """Reward vs standalone accuracy per client, with the α-BCF bounds s < a ≤ ((1−α)s/max s + α)·max a."""
    s = np.asarray(standalone, dtype=float)
    a = np.array([math.nan if v is None else v for v in rewards], dtype=float)
    if not np.all(np.isfinite(a)):
        return False
    fig = new_figure(5.6, 5.0, dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    grid = np.linspace(min(s.min(), a.min()) - 0.02, max(s.max(), a.max()) + 0.02, 100)
    upper = ((1 - alpha) * grid / s.max() + alpha) * a.max()
    ax.plot(100 * grid, 100 * grid, color="gray", lw=1, label="lower bound: reward = standalone")
    ax.plot(100 * grid, 100 * upper, color="tab:red", lw=1, ls="--", label=f"upper bound (α = {alpha:g})")
    passed = (s < a) & (a <= ((1 - alpha) * s / s.max() + alpha) * a.max())
    ax.scatter(100 * s[passed], 100 * a[passed], color="tab:green", s=30, label="within BCF bounds")
    ax.scatter(100 * s[~passed], 100 * a[~passed], color="tab:orange", marker="x", s=36, label="outside")
    for cid, (x, y) in enumerate(zip(s, a, strict=True)):
        label = (names or RunNames()).client(cid)
        ax.annotate(label, (100 * x, 100 * y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xlabel("standalone accuracy (%)")
    ax.set_ylabel("reward accuracy, final round (%)")
    ax.set_title(f"{title}: rewards vs standalone ({int(passed.sum())}/{len(s)} within BCF)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)
    return True


def plot_unit_frequency(
    snapshots: Mapping[int, np.ndarray], clients: int, path: Path, title: str, split: Sequence[int] = ()
) -> bool:
    """Left: per-unit share of allocated masks at each snapshot round; right: histograms of those shares."""
    usable = {r: f for r, f in snapshots.items() if r >= 2}
    if not usable:
        return False
    fig = new_figure(10.0, 4.0, dpi=110)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for r, freq in sorted(usable.items()):
        share = freq / (clients * (r - 1))
        left.plot(np.arange(len(share)), share, lw=0.8, label=f"round {r}")
        right.hist(share, bins=30, range=(0, 1), histtype="step", lw=1.2, label=f"round {r}")
    edge = 0
    for size in list(split)[:-1]:
        edge += size
        left.axvline(edge, color="gray", lw=0.6, ls=":")
    left.set_xlabel("unit index (dotted: mask-point boundaries)")
    left.set_ylabel("share of client masks holding the unit")
    left.set_ylim(0, 1.02)
    right.set_xlabel("share of client masks holding the unit")
    right.set_ylabel("units")
    left.set_title(f"{title}: unit frequency over rounds", fontsize=9)
    right.set_title("histogram per snapshot round", fontsize=9)
    right.legend(fontsize=6)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    save_figure(fig, path)
    return True


def plot_fairness_rounds(
    lines: Sequence[Mapping[str, Any]], report: Mapping[str, Any], path: Path, title: str
) -> bool:
    """Fairness (ρ×100) and the BCF rates (clean and code variant) per evaluated round."""
    rounds = [ln["round"] for ln in lines if isinstance(ln.get("fairness_pearson"), int | float)]
    if not rounds:
        return False
    fig = new_figure(10.0, 4.0, dpi=110)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    fair = [ln["fairness_pearson"] for ln in lines if isinstance(ln.get("fairness_pearson"), int | float)]
    left.plot(rounds, fair, lw=1, color="tab:blue", **curve_style(0, len(rounds)))
    info = report.get("fairness_pearson") or {}
    if info:
        text = f"best {info['best']:.2f} (round {info['best_round']})"
        if info.get("final") is not None:
            text += f", final {info['final']:.2f}"
        tail = info.get(f"last{report.get('last_rounds', 100)}_mean")
        if tail is not None:
            text += f", last-{report.get('last_rounds', 100)} mean {tail:.2f}"
        left.set_title(f"{title}: fairness\n{text}", fontsize=8)
    left.set_xlabel("round")
    left.set_ylabel("fairness (100·Pearson)")
    for i, (key, label) in enumerate(
        (("bcf_rate", "BCF rate (clean)"), ("bcf_rate_code", "BCF rate (code variant)"))
    ):
        xs = [ln["round"] for ln in lines if isinstance(ln.get(key), int | float)]
        ys = [ln[key] for ln in lines if isinstance(ln.get(key), int | float)]
        if xs:  # the two rates are often equal: their own styles keep both visible
            right.plot(xs, ys, lw=1, label=label, **curve_style(i, len(xs)))
    right.set_xlabel("round")
    right.set_ylabel("rate")
    right.set_title("α-BCF rate per round (code variant: −10/N penalty)", fontsize=8)
    right.legend(fontsize=7)
    for ax in (left, right):
        integer_rounds(ax)
        ax.grid(alpha=0.3)
    save_figure(fig, path)
    return True


def plot_mask_sizes(
    lines: Sequence[Mapping[str, Any]], standalone: np.ndarray, path: Path, title: str
) -> bool:
    """Each client's mask size per round, clients coloured by standalone accuracy."""
    rows = [(ln["round"], ln["mask_sizes"]) for ln in lines if ln.get("mask_sizes")]
    if not rows:
        return False
    rounds = [r for r, _ in rows]
    sizes = np.array([s for _, s in rows], dtype=float)
    fig = new_figure(dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    cmap = colormap("viridis")
    span = max(float(np.ptp(standalone)), 1e-12)
    for cid in range(sizes.shape[1]):
        colour = cmap((standalone[cid] - standalone.min()) / span)
        ax.plot(
            rounds,
            sizes[:, cid],
            color=colour,
            lw=0.9,
            label=f"{cid} ({100 * standalone[cid]:.1f}%)",
            **curve_style(cid, len(rounds)),
        )
    integer_rounds(ax)
    ax.set_xlabel("round")
    ax.set_ylabel("mask size (units)")
    ax.set_title(f"{title}: submodel size per client (legend: standalone acc.)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return True


# --------------------------------------------------------------------------------------------------------
# Semi-supervised runs: per-round series
# --------------------------------------------------------------------------------------------------------
def plot_round_series(
    series: Mapping[str, list[tuple[int, float]]], path: Path, title: str, ylabel: str
) -> bool:
    """One line per named series of (round, value) pairs (pseudo-label accuracy, the class prior)."""
    if not any(series.values()):
        return False
    fig = new_figure(7.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for i, (name, points) in enumerate(series.items()):
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=name, **curve_style(i, len(xs)))
    integer_rounds(ax)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True
