"""The gated FSSL table: can this run test ProxyFL > SAGE ≥ FixMatch-GPL > labeled-only at all, and does it?

    python tools/gated_fssl.py runs/proxyfl-gated/b [--min-gap 8] [--min-used 0.25]

Reads a ``fedhet compare`` directory of the gated protocol (configs/proxyfl/fashion-mnist-gated.toml) holding
fedavg-labeled, fixmatch-gpl, sage, proxyfl and fedavg-full for the same seeds. Accuracy is the mean over the
evaluations of the last 10 rounds (``summary["last"]``). It prints the validity gates first:

- all labels − labeled-only ≥ ``--min-gap`` points (there is room to gain from unlabeled data);
- FixMatch-GPL uses ≥ ``--min-used`` of the unlabeled samples (mean over its rounds; pseudo-labels pass τ);
- each paired difference of the ordering has the same sign in every seed;
- ProxyFL ≤ all labels (the upper bound holds);

and only then the ordering. A failed gate marks the table "not a test of the claim".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ORDER = [("proxyfl", "sage"), ("sage", "fixmatch-gpl"), ("fixmatch-gpl", "fedavg-labeled")]
NAMES = {
    "fedavg-labeled": "labeled-only",
    "fixmatch-gpl": "FixMatch-GPL",
    "sage": "SAGE",
    "proxyfl": "ProxyFL",
    "fedavg-full": "all labels",
}


def load(compare_dir: Path) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    """Per method and seed: the last-10 accuracy, and the mean fraction of unlabeled samples used."""
    acc: dict[str, dict[int, float]] = {}
    used: dict[str, dict[int, float]] = {}
    for run in sorted(p for p in compare_dir.iterdir() if (p / "summary.json").is_file()):
        summary = json.loads((run / "summary.json").read_text())
        method, seed = summary["method"], int(summary["seed"])
        acc.setdefault(method, {})[seed] = 100 * float(summary["last"]["accuracy"])
        lines = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines()]
        fractions = [ln["unlabeled_used_fraction"] for ln in lines if "unlabeled_used_fraction" in ln]
        if fractions:
            used.setdefault(method, {})[seed] = float(np.mean(fractions))
    return acc, used


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("compare_dir", type=Path)
    parser.add_argument("--min-gap", type=float, default=8.0)
    parser.add_argument("--min-used", type=float, default=0.25)
    args = parser.parse_args()
    acc, used = load(args.compare_dir)
    missing = [m for m in NAMES if m not in acc]
    if missing:
        print(f"missing methods in {args.compare_dir}: {missing}")
        return 2
    seeds = sorted(set.intersection(*(set(acc[m]) for m in NAMES)))
    mean = {m: float(np.mean([acc[m][s] for s in seeds])) for m in NAMES}
    std = {m: float(np.std([acc[m][s] for s in seeds])) for m in NAMES}
    print(f"seeds {seeds}; accuracy = mean of the last 10 evaluations, %")
    print("| method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± std | unlabeled used |")
    print("|---|" + "---|" * len(seeds) + "---|---|")
    for m, name in NAMES.items():
        frac = f"{100 * np.mean(list(used[m].values())):.1f} %" if m in used else "—"
        cells = " | ".join(f"{acc[m][s]:.2f}" for s in seeds)
        print(f"| {name} | {cells} | {mean[m]:.2f} ± {std[m]:.2f} | {frac} |")
    gap = mean["fedavg-full"] - mean["fedavg-labeled"]
    gpl_used = float(np.mean(list(used.get("fixmatch-gpl", {0: 0.0}).values())))
    gates = {
        f"all labels − labeled-only ≥ {args.min_gap:g} points ({gap:+.2f})": gap >= args.min_gap,
        f"GPL uses ≥ {100 * args.min_used:g} % of the unlabeled samples ({100 * gpl_used:.1f} %)": gpl_used
        >= args.min_used,
        f"ProxyFL ≤ all labels ({mean['proxyfl']:.2f} vs {mean['fedavg-full']:.2f})": mean["proxyfl"]
        <= mean["fedavg-full"],
    }
    paired = {}
    for a, b in ORDER:
        diffs = [acc[a][s] - acc[b][s] for s in seeds]
        paired[(a, b)] = diffs
        consistent = all(d > 0 for d in diffs) or all(d < 0 for d in diffs)
        gates[
            f"{NAMES[a]} − {NAMES[b]} has one sign in every seed ({', '.join(f'{d:+.2f}' for d in diffs)})"
        ] = consistent
    print("\nValidity gates:")
    for text, ok in gates.items():
        print(f"- [{'pass' if ok else 'FAIL'}] {text}")
    valid = all(gates.values())
    print("\nOrdering ProxyFL > SAGE ≥ FixMatch-GPL > labeled-only (paired by seed):")
    for (a, b), diffs in paired.items():
        relation = ">" if (a, b) != ("sage", "fixmatch-gpl") else "≥"
        holds = all(d > 0 for d in diffs) if relation == ">" else all(d >= 0 for d in diffs)
        print(
            f"- {NAMES[a]} {relation} {NAMES[b]}: {'holds' if holds else 'does not hold'}"
            f" (mean {np.mean(diffs):+.2f})"
        )
    print(
        "\nVerdict: "
        + (
            "a valid test of the claim"
            if valid
            else "NOT a test of the claim (a gate failed; the ordering says nothing)"
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
