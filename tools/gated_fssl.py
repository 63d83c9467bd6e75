"""The gated FSSL table: can this run test ProxyFL > SAGE ≥ FixMatch-GPL > labeled-only at all, and does it?

    python tools/gated_fssl.py runs/proxyfl-gated/b [--min-gap 8] [--min-used 0.25]
    python tools/gated_fssl.py runs/proxyfl-gated/b-lc0 runs/proxyfl-gated/b-lc0-1-2 \\
        runs/proxyfl-gated/b --labels "labels at 1 of 10 clients" "3 of 10" "10 of 10" \\
        --figure docs/figures/fssl_labeled_clients.png

Reads ``fedhet compare`` directories of the gated protocol (configs/proxyfl/fashion-mnist-gated.toml) holding
fedavg-labeled, fixmatch-gpl, sage, proxyfl and fedavg-full for the same seeds, and prints, per directory,
the per-seed table, the validity gates, then the ordering (fedhet.report.fssl_gates; ``fedhet reproduce
proxyfl-gated`` writes the same on a result page). A failed gate marks the table "not a test of the claim".
``--figure`` draws every method's mean ± std per directory as grouped bars (one group per directory).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fedhet.report.figures import colormap, new_figure, save_figure
from fedhet.report.fssl_gates import NAMES, GateReport, fssl_gates, gates_markdown, read_fssl_runs


def plot_settings(reports: list[GateReport], labels: list[str], path: Path) -> Path:
    """Grouped bars: one group per setting, one bar per method (mean over seeds, ± std)."""
    fig = new_figure(7.5, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    methods = list(NAMES)
    width = 0.8 / len(methods)
    colors = colormap("tab10")
    for j, m in enumerate(methods):
        means = [np.mean([r.accuracy[m][s] for s in r.seeds]) for r in reports]
        stds = [np.std([r.accuracy[m][s] for s in r.seeds]) for r in reports]
        x = np.arange(len(reports)) + (j - (len(methods) - 1) / 2) * width
        ax.bar(x, means, width, yerr=stds, capsize=2, color=colors(j), label=NAMES[m])
    ax.set_xticks(np.arange(len(reports)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("accuracy, mean of the last 10 rounds (%)")
    seeds = sorted({len(r.seeds) for r in reports})
    ax.set_title(f"Gated FSSL protocol, mean ± std over {'/'.join(map(str, seeds))} seeds", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    ax.set_ylim(0, 100)
    return save_figure(fig, path)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("compare_dirs", type=Path, nargs="+")
    parser.add_argument("--min-gap", type=float, default=8.0)
    parser.add_argument("--min-used", type=float, default=0.25)
    parser.add_argument("--labels", nargs="+", help="one label per directory (for --figure)")
    parser.add_argument("--figure", type=Path, help="grouped bars of every method per directory (PNG)")
    args = parser.parse_args()
    reports = []
    for directory in args.compare_dirs:
        try:
            report = fssl_gates(*read_fssl_runs(directory), args.min_gap, args.min_used)
        except ValueError as exc:
            print(f"{directory}: {exc}")
            return 2
        reports.append(report)
        if len(args.compare_dirs) > 1:
            print(f"## {directory}\n")
        print(gates_markdown(report))
    if args.figure:
        labels = args.labels or [str(d) for d in args.compare_dirs]
        if len(labels) != len(reports):
            parser.error(f"--labels gives {len(labels)} labels for {len(reports)} directories")
        print(f"figure written to {plot_settings(reports, labels, args.figure)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
