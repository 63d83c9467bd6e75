"""The measured facts behind the "gaps and their causes" of CELM Table 1's result pages, read from the
reproduction's runs (nothing is rerun):

    fedhet study celm-table1-causes table [RUNS]   # default RUNS: runs/reproduce/celm-table1-fmnist-full

Per row (one folder of RUNS per row, cells ``<method>-seed<k>``):

- **CELM − FedAvg**, final accuracy per seed;
- **CELM's weights against FedAvg's**: the total-variation distance ½ Σ_i |c_i − n_i / n| between CELM's
  aggregation weights and the sample shares FedAvg aggregates with, mean over the rounds and at the end, per
  seed (0: CELM aggregates as FedAvg does; 1: on disjoint clients);
- **CFFL**: the round from which its reputable set R holds a single client until the end (the sinh
  reputations' collapse, docs/baselines.md), and the number of classes the final server model never predicts
  correctly (recall 0);
- **CGSV**: the same count of dead classes (its collapse);
- **ShapFed** (γ/Σγ): the first round with a negative weight, the largest |weight| before the stop, the round
  the engine stopped the run in (diverged) and the best accuracy before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.engine.rundir import finished_runs, read_metrics, read_summary
from fedhet.studies.base import Study


def dead_classes(cell: Path) -> int:
    """Classes the final evaluated server model never predicts correctly (recall 0)."""
    recall = [ln["per_class_recall"] for ln in read_metrics(cell) if ln.get("per_class_recall")][-1]
    return sum(1 for r in recall if r == 0)


def single_client_from(cell: Path) -> int | None:
    """The first round from which CFFL's reputable set is one client in every later round, or None."""
    sets = [(ln["round"], ln.get("cffl_reputable")) for ln in read_metrics(cell) if "cffl_reputable" in ln]
    start = None
    for rnd, members in sets:
        if members is not None and len(members) == 1:
            start = rnd if start is None else start
        else:
            start = None
    return start


def shapfed_course(cell: Path) -> dict:
    weights = [(ln["round"], ln["contributions"]) for ln in read_metrics(cell) if ln.get("contributions")]
    negative = next((rnd for rnd, w in weights if min(w) < 0), None)
    s = read_summary(cell)
    return {
        "first_negative_weight": negative,
        "largest_abs_weight": max((max(abs(x) for x in w) for _, w in weights), default=None),
        "stopped_in": (s.get("diverged") or {}).get("round"),
        "best_accuracy": s["best"].get("accuracy"),
        "final_accuracy": s["final"].get("accuracy"),
    }


def weights_from_sample_shares(cell: Path) -> tuple[float, float]:
    """(mean over the rounds, final) total-variation distance between a run's aggregation weights (its
    ``contributions`` per round) and the clients' sample shares n_i / n (FedAvg's weights)."""
    sizes = np.asarray(read_summary(cell)["client_sizes"], dtype=np.float64)
    shares = sizes / sizes.sum()
    distances = [
        0.5 * float(np.abs(np.asarray(ln["contributions"], dtype=np.float64) - shares).sum())
        for ln in read_metrics(cell)
        if ln.get("contributions")
    ]
    if not distances:
        raise ValueError(f"{cell} records no contributions")
    return float(np.mean(distances)), distances[-1]


def final_accuracies(row: Path, method: str) -> dict[str, float]:
    """Seed -> final accuracy of the finished runs of ``method`` in one row."""
    return {p.name.split("seed")[1]: read_summary(p)["final"]["accuracy"] for p in finished_runs(row, method)}


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    root = dirs[0]
    rows = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not rows:
        raise ValueError(f"{root} holds no rows; run `fedhet reproduce celm-table1-fmnist` first")
    out: list[str] = []
    pairs: list[tuple[float, float]] = []  # per (row, seed): CELM's mean distance, CELM − FedAvg
    for row in rows:
        out.append(f"## {row.name}")
        celm, fedavg = final_accuracies(row, "celm"), final_accuracies(row, "fedavg")
        common = sorted(set(celm) & set(fedavg))
        if common:
            diff = [100 * (celm[s] - fedavg[s]) for s in common]
            out.append(
                f"CELM - FedAvg, final accuracy, per seed {common}: {', '.join(f'{d:+.2f}' for d in diff)}"
                f" (mean {np.mean(diff):+.2f})"
            )
        by_seed = {c.name.split("seed")[1]: weights_from_sample_shares(c) for c in finished_runs(row, "celm")}
        distances = list(by_seed.values())
        pairs += [(by_seed[s][0], 100 * (celm[s] - fedavg[s])) for s in common if s in by_seed]
        if distances:
            out.append(
                "celm: weights' total-variation distance from the sample shares (FedAvg's weights), mean "
                f"over rounds / final, per seed: {', '.join(f'{m:.3f} / {f:.3f}' for m, f in distances)}"
            )
        for method in ("cffl", "cgsv"):
            cells = finished_runs(row, method)
            if cells:
                out.append(
                    f"{method}: classes with final recall 0 per seed: {[dead_classes(c) for c in cells]}"
                )
        cffl = [single_client_from(c) for c in finished_runs(row, "cffl")]
        if cffl:
            out.append(f"cffl: R is one client from round (per seed; None = never for good): {cffl}")
        for cell in finished_runs(row, "shapfed"):
            c = shapfed_course(cell)
            out.append(
                f"shapfed {cell.name}: first negative weight in round {c['first_negative_weight']}, largest "
                f"|weight| {c['largest_abs_weight']:.2f}, stopped in round {c['stopped_in']}, best accuracy "
                f"{100 * c['best_accuracy']:.2f}, final {100 * c['final_accuracy']:.2f}"
            )
        out.append("")
    if len(pairs) >= 3:
        x, y = np.array(pairs).T
        out.append(
            f"across {len(pairs)} (row, seed) pairs: Pearson r between CELM's mean distance from the sample "
            f"shares and CELM − FedAvg = {np.corrcoef(x, y)[0, 1]:+.2f}"
        )
    return "\n".join(out)


STUDY = Study(
    name="celm-table1-causes",
    title="the facts behind CELM Table 1's gaps (CELM − FedAvg per seed, CFFL/CGSV/ShapFed collapse)",
    page="docs/results/celm-table1-fmnist.md",
    default_out="runs/reproduce/celm-table1-fmnist-full",
    table=table,
    reads="the runs of `fedhet reproduce celm-table1-fmnist` (or celm-table1-cifar10)",
)
