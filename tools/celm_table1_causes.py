"""The measured facts behind the "gaps and their causes" of CELM Table 1's result pages, read from the
reproduction's runs (nothing is rerun):

    python tools/celm_table1_causes.py [RUNS]   # default RUNS: runs/reproduce/celm-table1-fmnist-full

Per row (one folder of RUNS per row, cells ``<method>-seed<k>``):

- **CELM − FedAvg**, final accuracy per seed (the target: CELM ≥ FedAvg on at least 4 of 5 rows);
- **CFFL**: the round from which its reputable set R holds a single client until the end (the sinh
  reputations' collapse, docs/baselines.md), and the number of classes the final server model never predicts
  correctly (recall 0);
- **CGSV**: the same count of dead classes (its collapse);
- **ShapFed** (γ/Σγ): the first round with a negative weight, the largest |weight| before the stop, the round
  the engine stopped the run in (diverged) and the best accuracy before it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def lines(cell: Path) -> list[dict]:
    return [json.loads(s) for s in (cell / "metrics.jsonl").read_text().splitlines() if s.strip()]


def summary(cell: Path) -> dict:
    return json.loads((cell / "summary.json").read_text())


def dead_classes(cell: Path) -> int:
    """Classes the final evaluated server model never predicts correctly (recall 0)."""
    recall = [ln["per_class_recall"] for ln in lines(cell) if ln.get("per_class_recall")][-1]
    return sum(1 for r in recall if r == 0)


def single_client_from(cell: Path) -> int | None:
    """The first round from which CFFL's reputable set is one client in every later round, or None."""
    sets = [(ln["round"], ln.get("cffl_reputable")) for ln in lines(cell) if "cffl_reputable" in ln]
    start = None
    for rnd, members in sets:
        if members is not None and len(members) == 1:
            start = rnd if start is None else start
        else:
            start = None
    return start


def shapfed_course(cell: Path) -> dict:
    weights = [(ln["round"], ln["contributions"]) for ln in lines(cell) if ln.get("contributions")]
    negative = next((rnd for rnd, w in weights if min(w) < 0), None)
    s = summary(cell)
    return {
        "first_negative_weight": negative,
        "largest_abs_weight": max((max(abs(x) for x in w) for _, w in weights), default=None),
        "stopped_in": (s.get("diverged") or {}).get("round"),
        "best_accuracy": s["best"].get("accuracy"),
        "final_accuracy": s["final"].get("accuracy"),
    }


def seeds_of(row: Path, method: str) -> list[Path]:
    return sorted(p for p in row.glob(f"{method}-seed*") if (p / "summary.json").is_file())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="?", default="runs/reproduce/celm-table1-fmnist-full")
    args = parser.parse_args()
    rows = sorted(p for p in Path(args.runs).iterdir() if p.is_dir())
    if not rows:
        raise SystemExit(f"{args.runs} holds no rows; run `fedhet reproduce celm-table1-fmnist` first")
    wins = compared = 0
    for row in rows:
        print(f"## {row.name}")
        celm = {p.name.split("seed")[1]: summary(p)["final"]["accuracy"] for p in seeds_of(row, "celm")}
        fedavg = {p.name.split("seed")[1]: summary(p)["final"]["accuracy"] for p in seeds_of(row, "fedavg")}
        common = sorted(set(celm) & set(fedavg))
        if common:
            diff = [100 * (celm[s] - fedavg[s]) for s in common]
            wins += float(np.mean(diff)) >= 0
            compared += 1
            print(
                f"CELM - FedAvg, final accuracy, per seed {common}: {', '.join(f'{d:+.2f}' for d in diff)}"
                f" (mean {np.mean(diff):+.2f})"
            )
        for method in ("cffl", "cgsv"):
            cells = seeds_of(row, method)
            if cells:
                dead = [dead_classes(c) for c in cells]
                print(f"{method}: classes with final recall 0 per seed: {dead}")
        cffl = [single_client_from(c) for c in seeds_of(row, "cffl")]
        if cffl:
            print(f"cffl: R is one client from round (per seed; None = never for good): {cffl}")
        for cell in seeds_of(row, "shapfed"):
            c = shapfed_course(cell)
            print(
                f"shapfed {cell.name}: first negative weight in round {c['first_negative_weight']}, largest "
                f"|weight| {c['largest_abs_weight']:.2f}, stopped in round {c['stopped_in']}, best accuracy "
                f"{100 * c['best_accuracy']:.2f}, final {100 * c['final_accuracy']:.2f}"
            )
        print()
    print(f"rows where CELM's mean final accuracy >= FedAvg's: {wins} of {compared}")


if __name__ == "__main__":
    main()
