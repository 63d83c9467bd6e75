"""The robustness table (``fedhet robustness``; docs/results/robustness.md): hostile clients against every
defence and contribution method.

``run`` makes, on the shipped experiment robustness/fmnist-n10 (Fashion-MNIST, 10 clients, Dir(0.5)), one
compare cell per row and column: the rows are the clean run and every injected behaviour of ``[faults]``
(``fedhet.config.FAULT_BEHAVIOURS``) acted by f = 1 (client 0) or f = 3 (clients 0, 1, 2, colluding) of the
10 clients; the columns are FedAvg as published (no guard), FedAvg with fedhet's default defences, FedAvg with
each robust aggregation rule on top of the defaults, and CELM, CGSV, ShapFed and FedRAC with the defaults.
Runs do not stop when every update is rejected (``guards.max_all_rejected_rounds = 0``): a collapsed model is
a result here. ``table`` gives, per row and column, the hostile clients' total weight (the contribution
estimate where the method makes one, the mean share of the rounds' averages for the FedAvg columns, the mean
reward accuracy of the hostile clients for FedRAC) and the final accuracy against the clean run (mean over
seeds), then checks the defaults against their targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.config import FAULT_BEHAVIOURS
from fedhet.studies.base import CompareCell, Study, finished_seeds, read_lines, read_summary

CONFIG = "robustness/fmnist-n10"
CLIENTS = 10
#: f -> the hostile clients (colluding: same behaviour, shared statistics for the coordinated attacks)
HOSTILE = {1: (0,), 3: (0, 1, 2)}
#: no guard at all: the methods as their papers publish them
UNDEFENDED = {"guards.update_norm_factor": 0, "guards.num_examples_factor": 0}
#: Behaviour parameters beyond the [faults] defaults: a free rider hides its idleness under tiny noise (a
#: std of 1 would be the noise attack again).
BEHAVIOUR_SETTINGS: dict[str, dict[str, Any]] = {"free-rider": {"faults.noise_std": 1e-3}}


def _rules(f: int) -> dict[str, dict[str, Any]]:
    """The robust aggregation rules on top of the defaults, set for f hostile clients of 10."""
    return {
        "median": {"aggregation.rule": "median"},
        "trimmed-mean": {"aggregation.rule": "trimmed-mean", "aggregation.beta": 0.3},
        "krum": {"aggregation.rule": "krum", "aggregation.num_malicious_nodes": f},
        "multi-krum": {
            "aggregation.rule": "multi-krum",
            "aggregation.num_malicious_nodes": f,
            "aggregation.num_nodes_to_select": CLIENTS - f,
        },
        "centered-clipping": {"aggregation.rule": "centered-clipping", "aggregation.clipping_tau": 1.0},
    }


#: table column -> (variant, method); a variant is a cell of each row
COLUMNS: dict[str, tuple[str, str]] = {
    "FedAvg": ("undefended", "fedavg"),
    "FedAvg, defaults": ("defaults", "fedavg"),
    **{f"+ {rule}": (rule, "fedavg") for rule in _rules(1)},
    "CELM": ("defaults", "celm"),
    "CGSV": ("defaults", "cgsv"),
    "ShapFed": ("defaults", "shapfed"),
    "FedRAC": ("defaults", "fedrac"),
}
DEFAULTS_METHODS = ("fedavg", "celm", "cgsv", "shapfed", "fedrac")
#: the rows: (behaviour, f); the clean run once
ROWS: tuple[tuple[str, int], ...] = (("clean", 0),) + tuple(
    (behaviour, f) for f in HOSTILE for behaviour in FAULT_BEHAVIOURS
)
#: targets of the defaults (docs/results/robustness.md): the largest accuracy drop allowed, by f
TARGET_DROP = {1: 2.0, 3: 5.0}


def row_name(behaviour: str, f: int) -> str:
    return "clean" if behaviour == "clean" else f"{behaviour}/f{f}"


def _variants(f: int) -> dict[str, tuple[tuple[str, ...], dict[str, Any]]]:
    return {
        "undefended": (("fedavg",), UNDEFENDED),
        "defaults": (DEFAULTS_METHODS, {}),
        **{rule: (("fedavg",), sets) for rule, sets in _rules(max(f, 1)).items()},
    }


def cells() -> list[CompareCell]:
    out = []
    for behaviour, f in ROWS:
        fault: dict[str, Any] = {}
        if behaviour != "clean":
            fault = {f"faults.clients.{c}": behaviour for c in HOSTILE[f]}
            fault.update(BEHAVIOUR_SETTINGS.get(behaviour, {}))
        for variant, (methods, overrides) in _variants(f).items():
            sets = {"guards.max_all_rejected_rounds": 0, **fault, **overrides}
            out.append(CompareCell(f"{row_name(behaviour, f)}/{variant}", CONFIG, methods, sets))
    return out


def hostile_weight(run_dir: Path, method: str, hostile: tuple[int, ...]) -> float:
    """The hostile clients' total weight in one run (see the module docstring); FedRAC: their mean reward."""
    if method == "fedrac":
        rewards = read_summary(run_dir)["rewards"]
        return float(np.mean([rewards[c] for c in hostile]))
    lines = read_lines(run_dir)
    if method == "fedavg":
        shares = [
            sum(line.get("aggregation_weights", {}).get(str(c), 0.0) for c in hostile) for line in lines
        ]
        return float(np.mean(shares))
    reported = [line["contributions"] for line in lines if line.get("contributions")]
    return float(sum(reported[-1][c] for c in hostile)) if reported else float("nan")


def _rejected_honest(run_dir: Path, hostile: tuple[int, ...]) -> int:
    """How many updates of honest clients the run rejected (over all rounds)."""
    return sum(
        1 for line in read_lines(run_dir) for cid in line.get("rejected", {}) if int(cid) not in hostile
    )


def collect(out: Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(row, column) -> {"weight", "accuracy", "honest_rejected", "top"} over the seeds found; "top" is 1
    where a hostile client holds the largest weight (or reward) of the run."""
    found: dict[tuple[str, str], dict[str, list[float]]] = {}
    for behaviour, f in ROWS:
        hostile = HOSTILE.get(f, ())
        for column, (variant, method) in COLUMNS.items():
            runs = finished_seeds(out / row_name(behaviour, f) / variant, method)
            cell: dict[str, list[float]] = {"weight": [], "accuracy": [], "honest_rejected": [], "top": []}
            for run in runs:
                summary = read_summary(run)
                acc = summary["final"].get("accuracy")
                cell["accuracy"].append(float("nan") if acc is None else float(acc))
                cell["honest_rejected"].append(_rejected_honest(run, hostile))
                if hostile:
                    cell["weight"].append(hostile_weight(run, method, hostile))
                    cell["top"].append(float(_hostile_on_top(run, method, hostile)))
            found[row_name(behaviour, f), column] = cell
    return found


def _hostile_on_top(run_dir: Path, method: str, hostile: tuple[int, ...]) -> bool:
    """Whether a hostile client holds the largest weight (or reward) of the run."""
    if method == "fedrac":
        values = read_summary(run_dir)["rewards"]
    elif method == "fedavg":
        lines = read_lines(run_dir)
        values = [
            float(np.mean([line.get("aggregation_weights", {}).get(str(c), 0.0) for line in lines]))
            for c in range(CLIENTS)
        ]
    else:
        reported = [line["contributions"] for line in read_lines(run_dir) if line.get("contributions")]
        if not reported:
            return False
        values = reported[-1]
    values = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
    return int(np.argmax(values)) in hostile and values.max() > np.max(np.delete(values, list(hostile)))


def _mean(values: list[float]) -> float:
    return float(np.nanmean(values)) if values else float("nan")


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    found = collect(dirs[0])
    rows = ["| hostile clients | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for behaviour, f in ROWS:
        name = row_name(behaviour, f)
        cells_ = []
        for column, (_, method) in COLUMNS.items():
            cell, clean = found[name, column], found["clean", column]
            if not cell["accuracy"]:
                cells_.append("–")
                continue
            acc = 100 * _mean(cell["accuracy"])
            delta = (
                ""
                if behaviour == "clean" or not clean["accuracy"]
                else f" ({acc - 100 * _mean(clean['accuracy']):+.1f})"
            )
            if behaviour == "clean":
                cells_.append(f"{acc:.1f}")
                continue
            weight = _mean(cell["weight"])
            shown = f"{100 * weight:.0f} %" if method == "fedrac" else f"{weight:.2f}"
            cells_.append(f"{shown} · {acc:.1f}{delta}")
        rows.append(f"| {name} | " + " | ".join(cells_) + " |")
    seeds = sorted({len(v["accuracy"]) for v in found.values() if v["accuracy"]})
    seeds_text = (
        " to ".join(str(s) for s in (seeds[0], seeds[-1]))
        if len(seeds) > 1
        else str(seeds[0] if seeds else 0)
    )
    rows += [
        "",
        "Each cell: the hostile clients' total weight · final accuracy % (change against the clean run of "
        f"the same column), mean of {seeds_text} seeds; FedRAC shows the hostile clients' mean reward "
        "accuracy in place of a weight. A fair share is 0.10 per client (0.30 for f = 3).",
        "",
        *targets(found),
    ]
    return "\n".join(rows)


def targets(found: Mapping[tuple[str, str], Mapping[str, list[float]]]) -> list[str]:
    """The defaults against their targets, computed from the cells: with the default defences no attack puts
    a hostile client on top, accuracy stays within 2 points of clean at f = 1 and 5 points at f = 3, and no
    honest update is rejected in a clean run."""
    lines = ["**Targets of the defaults** (computed from the cells above):", ""]
    default_columns = [c for c, (variant, _) in COLUMNS.items() if variant == "defaults"]
    for column in default_columns:
        clean = found["clean", column]
        if not clean["accuracy"]:
            lines.append(f"- {column}: not measured")
            continue
        misses, measured = [], 0
        for behaviour, f in ROWS:
            if behaviour == "clean":
                continue
            cell = found[row_name(behaviour, f), column]
            if not cell["accuracy"]:
                continue
            measured += 1
            drop = 100 * (_mean(clean["accuracy"]) - _mean(cell["accuracy"]))
            if drop > TARGET_DROP[f]:
                misses.append(f"{row_name(behaviour, f)} −{drop:.1f} pts")
            if any(cell["top"]):
                misses.append(f"{row_name(behaviour, f)} hostile on top in {int(sum(cell['top']))} seed(s)")
        honest = int(sum(clean["honest_rejected"]))
        verdict = "all met" if not misses and honest == 0 else "missed: " + "; ".join(misses)
        extra = f"; honest updates rejected in the clean runs: {honest}"
        lines.append(f"- **{column}** ({measured} attacked rows measured): {verdict}{extra}")
    return lines


def figure(dirs: list[Path], path: Path, options: Mapping[str, Any]) -> Path:
    """Accuracy change against the clean run, row × column, one panel per f."""
    from fedhet.report.figures import new_figure, save_figure

    found = collect(dirs[0])
    columns = list(COLUMNS)
    fig = new_figure(20, 9)
    axes = fig.subplots(1, 2)
    for ax, f in zip(axes, HOSTILE, strict=True):
        names = [row_name(b, f) for b in FAULT_BEHAVIOURS]
        change = np.array(
            [
                [
                    100 * (_mean(found[n, c]["accuracy"]) - _mean(found["clean", c]["accuracy"]))
                    for c in columns
                ]
                for n in names
            ]
        )
        ax.imshow(change, cmap="RdBu", vmin=-60, vmax=60, aspect="auto")
        ax.set_xticks(range(len(columns)), columns, rotation=35, ha="right")
        ax.set_yticks(range(len(names)), list(FAULT_BEHAVIOURS))
        ax.set_title(f"f = {f} hostile of {CLIENTS}: final accuracy change vs clean (points)")
        for i in range(len(names)):
            for j in range(len(columns)):
                if np.isfinite(change[i, j]):
                    ax.text(j, i, f"{change[i, j]:+.0f}", ha="center", va="center", fontsize=7)
    fig.suptitle("Hostile clients against FedAvg, the robust rules and the contribution methods (defaults)")
    return save_figure(fig, path)


STUDY = Study(
    name="robustness",
    title="hostile clients (every injected behaviour, f = 1 and 3 of 10) against FedAvg, the robust "
    "aggregation rules, CELM, CGSV, ShapFed and FedRAC",
    page="docs/robustness.md",
    default_out="runs/robustness",
    cells=cells,
    table=table,
    figure=figure,
    default_figure="docs/figures/robustness.png",
)
