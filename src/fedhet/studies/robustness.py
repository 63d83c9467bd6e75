"""The robustness table (docs/robustness.md): one hostile client against each method.

``run`` compares, on the shipped experiment robustness/fmnist-n10 (Fashion-MNIST, 10 clients, Dir(0.5)),
once per behaviour (clean, then each of ``fedhet.config.FAULT_BEHAVIOURS`` injected by client 0) and
variant: the methods as published, with no guard (``undefended``); CELM with ``evidence_scale='median'``
and no guard; every method with fedhet's default defences (the update-norm and sample-count guards at
factor 10). Runs do not stop when every update is rejected (``guards.max_all_rejected_rounds = 0``): a
collapsed model is a result here. ``table`` gives, per behaviour and method, the hostile client's weight
(its contribution estimate where the method makes one, its mean share of the rounds' averages for FedAvg,
its reward accuracy for FedRAC) and the final accuracy against the clean run, mean over seeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.config import FAULT_BEHAVIOURS
from fedhet.studies.base import CompareCell, Study, finished_seeds, read_lines, read_summary

CONFIG = "robustness/fmnist-n10"
HOSTILE = 0
METHODS = ("fedavg", "celm", "cgsv", "shapfed", "fedrac")
#: no guard at all: the methods as their papers publish them
UNDEFENDED = {"guards.update_norm_factor": 0, "guards.num_examples_factor": 0}
#: variant -> (methods, overrides, method parameters)
VARIANTS: dict[str, tuple[tuple[str, ...], dict[str, Any], dict[str, dict[str, Any]]]] = {
    "undefended": (METHODS, UNDEFENDED, {}),
    "celm-robust": (("celm",), UNDEFENDED, {"celm": {"evidence_scale": "median"}}),
    "defaults": (METHODS, {}, {}),
}
#: table column -> (variant, method)
COLUMNS = {
    "FedAvg": ("undefended", "fedavg"),
    "FedAvg, defaults": ("defaults", "fedavg"),
    "CELM": ("undefended", "celm"),
    "CELM robust": ("celm-robust", "celm"),
    "CELM, defaults": ("defaults", "celm"),
    "CGSV": ("undefended", "cgsv"),
    "CGSV, defaults": ("defaults", "cgsv"),
    "ShapFed": ("undefended", "shapfed"),
    "ShapFed, defaults": ("defaults", "shapfed"),
    "FedRAC": ("undefended", "fedrac"),
    "FedRAC, defaults": ("defaults", "fedrac"),
}
BEHAVIOURS = ("clean", *FAULT_BEHAVIOURS)


def cells() -> list[CompareCell]:
    out = []
    for behaviour in BEHAVIOURS:
        fault = {} if behaviour == "clean" else {f"faults.clients.{HOSTILE}": behaviour}
        for variant, (methods, overrides, params) in VARIANTS.items():
            sets = {"guards.max_all_rejected_rounds": 0, **fault, **overrides}
            out.append(CompareCell(f"{behaviour}/{variant}", CONFIG, methods, sets, params))
    return out


def hostile_weight(run_dir: Path, method: str) -> float:
    """The hostile client's weight in one run (see the module docstring)."""
    if method == "fedrac":
        return float(read_summary(run_dir)["rewards"][HOSTILE])
    lines = read_lines(run_dir)
    if method == "fedavg":
        return float(np.mean([line.get("aggregation_weights", {}).get(str(HOSTILE), 0.0) for line in lines]))
    reported = [line["contributions"] for line in lines if line.get("contributions")]
    return float(reported[-1][HOSTILE]) if reported else float("nan")


def collect(out: Path) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    """(behaviour, column) -> (hostile weights, final accuracies) over the seeds found."""
    found: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for behaviour in BEHAVIOURS:
        for column, (variant, method) in COLUMNS.items():
            runs = finished_seeds(out / behaviour / variant, method)
            accs = [read_summary(r)["final"].get("accuracy") for r in runs]
            found[behaviour, column] = (
                [hostile_weight(r, method) for r in runs],
                [float("nan") if a is None else float(a) for a in accs],
            )
    return found


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    found = collect(dirs[0])
    rows = ["| client 0 | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for behaviour in BEHAVIOURS:
        cells_ = []
        for column in COLUMNS:
            weights, accs = found[behaviour, column]
            clean = found["clean", column][1]
            if not accs:
                cells_.append("–")
                continue
            acc = 100 * float(np.nanmean(accs))
            delta = (
                "" if behaviour == "clean" or not clean else f" ({acc - 100 * float(np.nanmean(clean)):+.1f})"
            )
            weight = float(np.nanmean(weights))
            shown = f"{100 * weight:.1f} %" if COLUMNS[column][1] == "fedrac" else f"{weight:.3f}"
            cells_.append(f"{shown} · {acc:.1f}{delta}")
        rows.append(f"| {behaviour} | " + " | ".join(cells_) + " |")
    seeds = max((len(v[1]) for v in found.values()), default=0)
    rows += [
        "",
        f"Each cell: the hostile client's weight · final accuracy % (change against the clean run), mean of "
        f"{seeds} seeds; for FedRAC the hostile client's reward accuracy in place of a weight. Honest "
        f"clients share 1 − weight; a fair share is {1 / 10:.3f}.",
    ]
    return "\n".join(rows)


def figure(dirs: list[Path], path: Path, options: Mapping[str, Any]) -> Path:
    """Two heat maps, behaviour × method: the hostile client's weight, and the accuracy change against the
    clean run (FedRAC's reward accuracy is not a weight: its column shows the reward as a fraction)."""
    from fedhet.report.figures import new_figure, save_figure

    found = collect(dirs[0])
    faulty = [b for b in BEHAVIOURS if b != "clean"]
    columns = list(COLUMNS)
    mean = lambda v: np.nanmean(v) if v else np.nan  # noqa: E731
    weight = np.array([[mean(found[b, c][0]) for c in columns] for b in faulty])
    clean = {c: mean(found["clean", c][1]) for c in columns}
    change = np.array([[100 * (mean(found[b, c][1]) - clean[c]) for c in columns] for b in faulty])
    seeds = max((len(v[1]) for v in found.values()), default=0)
    fig = new_figure(18, 4.8)
    axes = fig.subplots(1, 2)
    panels = (
        (weight, "hostile client's weight (FedRAC: its reward accuracy)", "Reds", 0, 1, "{:.2f}"),
        (change, "final accuracy change vs the clean run (points)", "RdBu", -70, 70, "{:+.1f}"),
    )
    for ax, (values, title, cmap, low, high, fmt) in zip(axes, panels, strict=True):
        ax.imshow(values, cmap=cmap, vmin=low, vmax=high, aspect="auto")
        ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
        ax.set_yticks(range(len(faulty)), faulty)
        ax.set_title(title)
        for i in range(len(faulty)):
            for j in range(len(columns)):
                if np.isfinite(values[i, j]):
                    ax.text(j, i, fmt.format(values[i, j]), ha="center", va="center", fontsize=8)
    fig.suptitle(f"One hostile client (client 0) of 10, Fashion-MNIST Dir(0.5), mean of {seeds} seeds")
    return save_figure(fig, path)


STUDY = Study(
    name="robustness",
    title="one hostile client (each injected fault) against FedAvg, CELM, CGSV, ShapFed and FedRAC",
    page="docs/robustness.md",
    default_out="runs/robustness",
    cells=cells,
    table=table,
    figure=figure,
    default_figure="docs/figures/robustness.png",
)
