"""The measured facts behind the "gaps and their causes" of FedRAC's result pages, read from a reproduction's
runs (nothing is rerun):

    fedhet study fedrac-causes table [RUNS] [--alpha 0.5]   # default RUNS: runs/reproduce/fedrac-fmnist-full

Per row (one folder of RUNS per row, cells ``<method>-seed<k>``) and cell:

- **fairness** (100 × Pearson of rewards against standalone accuracies): the best over evaluated rounds and
  the round it came from, the final value and the mean of the last 100 evaluations. A best far above the
  last-100 mean is the maximum of a noisy series, not a level the method holds;
- **the α-BCF rate** at its best round and at the final round, with each failing client put in one of two
  classes: *below* (its reward a_i ≤ s_i, its standalone accuracy) or *above* (a_i over the bound
  ((1 − α)·s_i / max s + α)·max a). The classes are computed here from the logged rewards, apart from
  ``fedhet.metrics``; their sum is checked against the logged rate;
- **the window**: max a − max s (how far the best reward beats the best standalone client) and the mean width
  of the clients' windows (s_i, upper_i], in accuracy points, at the final round;
- **ties**: the largest group of clients with equal rewards at the final round (FedRAC's tied submodel sizes
  give equal rewards), and, in brackets after the *above* count, how many of the clients above are in it;
- **a − s**: the smallest and largest reward minus standalone accuracy at the final round, in points (a
  method whose rewards stay at the standalone accuracies correlates perfectly with them);
- **below at the best rate**: each client below its standalone accuracy at the best-rate round, as s → a;
- **the lowest client**: in how many evaluations the client with the lowest standalone accuracy has a reward
  exactly equal to it (a client at its standalone accuracy misses the bound, which asks for a_i > s_i).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.engine.rundir import is_finished, read_metrics, read_summary
from fedhet.studies.base import Option, Study


def evaluations(cell: Path) -> list[dict]:
    """The evaluated rounds of a cell (those with rewards), in order."""
    return [r for r in read_metrics(cell) if r.get("rewards") is not None]


def standalone(cell: Path) -> np.ndarray:
    return np.asarray(read_summary(cell)["standalone"], dtype=np.float64)


def bcf_classes(s: np.ndarray, a: np.ndarray, alpha: float) -> tuple[int, int, float]:
    """(clients below their standalone accuracy, clients above their upper bound, mean window width)."""
    upper = (alpha + (1.0 - alpha) * s / s.max()) * a.max()
    below = int(np.sum(a <= s))
    above = int(np.sum((a > s) & (a > upper)))
    return below, above, float(np.mean(upper - s))


def tied_above(s: np.ndarray, a: np.ndarray, alpha: float) -> int:
    """How many of the clients above their upper bound share the most common reward (a tie)."""
    upper = (alpha + (1.0 - alpha) * s / s.max()) * a.max()
    rounded = np.round(a, 6)
    values, counts = np.unique(rounded, return_counts=True)
    tied = (rounded == values[counts.argmax()]) if counts.max() > 1 else np.zeros_like(a, dtype=bool)
    return int(np.sum(tied & (a > s) & (a > upper)))


def cell_facts(cell: Path, alpha: float) -> dict:
    evals = evaluations(cell)
    if not evals:
        return {}
    s = standalone(cell)
    fair = [(e["round"], e.get("fairness_pearson")) for e in evals if e.get("fairness_pearson") is not None]
    best_round, best_fair = max(fair, key=lambda t: t[1]) if fair else (None, None)
    rate_best = max(evals, key=lambda e: e.get("bcf_rate", -1.0))
    out = {
        "fairness_best": best_fair,
        "fairness_best_round": best_round,
        "fairness_final": fair[-1][1] if fair else None,
        "fairness_last100": float(np.mean([v for _, v in fair[-100:]])) if fair else None,
    }
    for label, e in (("rate_best", rate_best), ("rate_final", evals[-1])):
        a = np.asarray(e["rewards"], dtype=np.float64)
        below, above, width = bcf_classes(s, a, alpha)
        logged = e.get("bcf_rate")
        recomputed = 1.0 - (below + above) / len(a)
        if logged is not None and abs(logged - recomputed) > 1e-9:
            raise ValueError(f"{cell}: round {e['round']}: logged rate {logged} != recomputed {recomputed}")
        out[label] = {
            "round": e["round"],
            "rate": recomputed,
            "below": below,
            "above": above,
            "tied_above": tied_above(s, a, alpha),
        }
    a_best = np.asarray(rate_best["rewards"], dtype=np.float64)
    out["below_at_best_rate"] = [(100 * s[i], 100 * a_best[i]) for i in np.flatnonzero(a_best <= s)]
    lowest = int(s.argmin())
    out["lowest_equal"] = sum(1 for e in evals if e["rewards"][lowest] == s[lowest]), len(evals)
    a = np.asarray(evals[-1]["rewards"], dtype=np.float64)
    out["final_gap_points"] = (100 * float((a - s).min()), 100 * float((a - s).max()))
    out["gain_points"] = 100 * (a.max() - s.max())
    out["window_points"] = 100 * bcf_classes(s, a, alpha)[2]
    out["largest_tie"] = int(np.unique(np.round(a, 6), return_counts=True)[1].max())
    return out


def points(value: float | None) -> str:
    """A fairness value, or why there is none: Pearson is undefined when every client has the same reward
    (e.g. IAFL giving all clients one model), and the engine then logs none."""
    return "undefined" if value is None else f"{value:.2f}"


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    root, alpha = dirs[0], float(options.get("alpha", 0.5))
    if not root.is_dir():
        raise ValueError(f"{root} does not exist; run `fedhet reproduce` on a FedRAC table first")
    out: list[str] = []
    for row in sorted(p for p in root.iterdir() if p.is_dir()):
        out += [
            "",
            f"## {row.name}",
            "cell | fairness best (round) | final | last 100 | rate best (round): below/above (tied) | "
            "rate final: below/above (tied) | max a − max s | window | largest tie | a − s final | "
            "below at best rate (s → a) | lowest client: a = s",
        ]
        for cell in sorted(p for p in row.iterdir() if is_finished(p)):
            f = cell_facts(cell, alpha)
            if not f:
                continue
            rb, rf = f["rate_best"], f["rate_final"]
            out.append(
                f"{cell.name} | {points(f['fairness_best'])} ({f['fairness_best_round']}) | "
                f"{points(f['fairness_final'])} | {points(f['fairness_last100'])} | "
                f"{rb['rate']:.1f} ({rb['round']}): {rb['below']}/{rb['above']} ({rb['tied_above']}) | "
                f"{rf['rate']:.1f}: {rf['below']}/{rf['above']} ({rf['tied_above']}) | "
                f"{f['gain_points']:+.2f} | "
                f"{f['window_points']:.2f} | {f['largest_tie']} | "
                f"{f['final_gap_points'][0]:+.2f}..{f['final_gap_points'][1]:+.2f} | "
                + (", ".join(f"{si:.2f} → {ai:.2f}" for si, ai in f["below_at_best_rate"]) or "none")
                + f" | {f['lowest_equal'][0]} of {f['lowest_equal'][1]}"
            )
    return "\n".join(out)


STUDY = Study(
    name="fedrac-causes",
    title="the measured facts behind FedRAC's result pages (fairness best/final/last 100, BCF classes, ties)",
    page="docs/results/fedrac-fairness-substitute.md",
    default_out="runs/reproduce/fedrac-fmnist-full",
    table=table,
    options=(Option("alpha", float, 0.5, "the α of the BCF bound (eval.bcf_alpha)"),),
    reads="the runs of `fedhet reproduce fedrac-fairness-substitute` (or fedrac-rate, fedrac-ablation)",
)
