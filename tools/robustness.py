"""The robustness table (docs/robustness.md): one hostile client against each method.

    python tools/robustness.py run   [--seeds 3] [--jobs 2] [--out runs/robustness]
    python tools/robustness.py table [--out runs/robustness] [--figure docs/figures/robustness.png]

``run`` calls ``fedhet compare`` on configs/robustness/fmnist-n10.toml once per behaviour (clean, then each
of fedhet.config.FAULT_BEHAVIOURS injected by client 0) and variant: the methods as published; CELM with
``evidence_scale='median'``; FedAvg and CELM with the update guards on. Finished cells are reused, so an
interrupted ``run`` resumes. Runs do not stop when every update is rejected
(``guards.max_all_rejected_rounds=0``): a collapsed model is a result here. ``table`` prints, per behaviour
and method, the hostile client's weight (its contribution estimate where the method makes one, its mean
share of the rounds' averages for FedAvg, its reward accuracy for FedRAC) and the final accuracy against
the clean run, mean over seeds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from fedhet.config import FAULT_BEHAVIOURS

CONFIG = "configs/robustness/fmnist-n10.toml"
HOSTILE = 0
GUARDS = ["guards.update_norm_factor=10", "guards.num_examples_factor=10"]
#: variant -> (methods, extra compare arguments)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "published": ("fedavg,celm,cgsv,shapfed,fedrac", []),
    "celm-robust": ("celm", ["--method-param", "celm.evidence_scale=median"]),
    "guards": ("fedavg,celm", [a for g in GUARDS for a in ("--set", g)]),
}
#: table column -> (variant, method)
COLUMNS = {
    "FedAvg": ("published", "fedavg"),
    "FedAvg + guards": ("guards", "fedavg"),
    "CELM": ("published", "celm"),
    "CELM robust": ("celm-robust", "celm"),
    "CELM + guards": ("guards", "celm"),
    "CGSV": ("published", "cgsv"),
    "ShapFed": ("published", "shapfed"),
    "FedRAC": ("published", "fedrac"),
}
BEHAVIOURS = ("clean", *FAULT_BEHAVIOURS)


def run(out: Path, seeds: int, jobs: int) -> None:
    for behaviour in BEHAVIOURS:
        fault = [] if behaviour == "clean" else ["--set", f"faults.clients.{HOSTILE}={behaviour}"]
        for variant, (methods, extra) in VARIANTS.items():
            cell = out / behaviour / variant
            cmd = [
                sys.executable, "-m", "fedhet.cli", "compare", CONFIG, "--methods", methods,
                "--seeds", str(seeds), "--jobs", str(jobs), "--out", str(cell), "--quiet", "--no-report",
                "--set", "guards.max_all_rejected_rounds=0", *fault, *extra,
            ]  # fmt: skip
            print(f"[{behaviour} / {variant}]", " ".join(cmd[2:]), flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def hostile_weight(run_dir: Path, method: str) -> float:
    """The hostile client's weight in one run (see the module docstring)."""
    lines = [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines() if s.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    if method == "fedrac":
        return float(summary["rewards"][HOSTILE])
    if method == "fedavg":
        return float(np.mean([line.get("aggregation_weights", {}).get(str(HOSTILE), 0.0) for line in lines]))
    reported = [line["contributions"] for line in lines if line.get("contributions")]
    return float(reported[-1][HOSTILE]) if reported else float("nan")


def collect(out: Path) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    """(behaviour, column) -> (hostile weights, final accuracies) over the seeds found."""
    found: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for behaviour in BEHAVIOURS:
        for column, (variant, method) in COLUMNS.items():
            cell = out / behaviour / variant
            runs = sorted(cell.glob(f"{method}-seed*")) if cell.is_dir() else []
            runs = [r for r in runs if (r / "summary.json").is_file()]
            weights = [hostile_weight(r, method) for r in runs]
            accs = []
            for r in runs:
                acc = json.loads((r / "summary.json").read_text())["final"].get("accuracy")
                accs.append(float("nan") if acc is None else float(acc))
            found[behaviour, column] = (weights, accs)
    return found


def table(out: Path) -> str:
    found = collect(out)
    head = "| client 0 | " + " | ".join(COLUMNS) + " |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for behaviour in BEHAVIOURS:
        cells = []
        for column in COLUMNS:
            weights, accs = found[behaviour, column]
            clean = found["clean", column][1]
            if not accs:
                cells.append("–")
                continue
            acc = 100 * float(np.nanmean(accs))
            delta = (
                "" if behaviour == "clean" or not clean else f" ({acc - 100 * float(np.nanmean(clean)):+.1f})"
            )
            weight = float(np.nanmean(weights))
            shown = f"{100 * weight:.1f} %" if COLUMNS[column][1] == "fedrac" else f"{weight:.3f}"
            cells.append(f"{shown} · {acc:.1f}{delta}")
        rows.append(f"| {behaviour} | " + " | ".join(cells) + " |")
    seeds = max((len(v[1]) for v in found.values()), default=0)
    rows.append("")
    rows.append(
        f"Each cell: the hostile client's weight · final accuracy % (change against the clean run), mean of "
        f"{seeds} seeds; for FedRAC the hostile client's reward accuracy in place of a weight. Honest "
        f"clients share 1 − weight; a fair share is {1 / 10:.3f}."
    )
    return "\n".join(rows)


def figure(out: Path, path: Path) -> Path:
    """Two heat maps, behaviour × method: the hostile client's weight, and the accuracy change against the
    clean run (FedRAC's reward accuracy is not a weight: its column shows the reward as a fraction)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = collect(out)
    faulty = [b for b in BEHAVIOURS if b != "clean"]
    columns = list(COLUMNS)
    weight = np.array(
        [[np.nanmean(found[b, c][0]) if found[b, c][0] else np.nan for c in columns] for b in faulty]
    )
    clean = {c: np.nanmean(found["clean", c][1]) if found["clean", c][1] else np.nan for c in columns}
    change = np.array(
        [
            [100 * (np.nanmean(found[b, c][1]) - clean[c]) if found[b, c][1] else np.nan for c in columns]
            for b in faulty
        ]
    )
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.8), constrained_layout=True)
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
    fig.suptitle("One hostile client (client 0) of 10, Fashion-MNIST Dir(0.5), 30 rounds, mean of 3 seeds")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "table"))
    parser.add_argument("--out", type=Path, default=Path("runs/robustness"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--figure", type=Path, help="also draw the table as heat maps (a PNG path)")
    args = parser.parse_args()
    if args.action == "run":
        run(args.out, args.seeds, args.jobs)
    print(table(args.out))
    if args.figure:
        print(f"figure: {figure(args.out, args.figure)}")


if __name__ == "__main__":
    main()
