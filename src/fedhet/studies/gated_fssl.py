"""The gated FSSL table: can this run test ProxyFL > SAGE ≥ FixMatch-GPL > labeled-only at all, and does it?

    fedhet study gated-fssl table runs/proxyfl-gated/b [--min-gap 8] [--min-used 0.25]
    fedhet study gated-fssl table runs/proxyfl-gated/b-lc0 runs/proxyfl-gated/b-lc0-1-2 \\
        runs/proxyfl-gated/b --labels "labels at 1 of 10 clients" "3 of 10" "10 of 10" \\
        --figure docs/figures/fssl_labeled_clients.png

Reads ``fedhet compare`` directories of the gated protocol (shipped experiment proxyfl/fashion-mnist-gated)
holding fedavg-labeled, fixmatch-gpl, sage, proxyfl and fedavg-full for the same seeds, and gives, per
directory, the per-seed table, the validity gates, then the ordering (``fedhet.report.fssl_gates``;
``fedhet reproduce proxyfl-gated`` writes the same on a result page). A failed gate marks the table "not a
test of the claim". The figure draws every method's mean ± std per directory as grouped bars.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.report.figures import colormap, new_figure, save_figure
from fedhet.report.fssl_gates import NAMES, GateReport, fssl_gates, gates_markdown, read_fssl_runs
from fedhet.studies.base import Option, Study


def reports(dirs: list[Path], options: Mapping[str, Any]) -> list[GateReport]:
    return [
        fssl_gates(
            *read_fssl_runs(d), float(options.get("min_gap", 8.0)), float(options.get("min_used", 0.25))
        )
        for d in dirs
    ]


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    parts = []
    for directory, report in zip(dirs, reports(dirs, options), strict=True):
        head = [f"## {directory}", ""] if len(dirs) > 1 else []
        parts.append("\n".join([*head, gates_markdown(report)]))
    return "\n\n".join(parts)


def figure(dirs: list[Path], path: Path, options: Mapping[str, Any]) -> Path:
    """Grouped bars: one group per directory, one bar per method (mean over seeds, ± std)."""
    labels = options.get("labels") or [str(d) for d in dirs]
    if len(labels) != len(dirs):
        raise ValueError(f"--labels gives {len(labels)} labels for {len(dirs)} directories")
    found = reports(dirs, options)
    fig = new_figure(7.5, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    methods = list(NAMES)
    width = 0.8 / len(methods)
    colors = colormap("tab10")
    for j, m in enumerate(methods):
        means = [np.mean([r.accuracy[m][s] for s in r.seeds]) for r in found]
        stds = [np.std([r.accuracy[m][s] for s in r.seeds]) for r in found]
        x = np.arange(len(found)) + (j - (len(methods) - 1) / 2) * width
        ax.bar(x, means, width, yerr=stds, capsize=2, color=colors(j), label=NAMES[m])
    ax.set_xticks(np.arange(len(found)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("accuracy, mean of the last 10 rounds (%)")
    seeds = sorted({len(r.seeds) for r in found})
    ax.set_title(f"Gated FSSL protocol, mean ± std over {'/'.join(map(str, seeds))} seeds", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    ax.set_ylim(0, 100)
    return save_figure(fig, path)


STUDY = Study(
    name="gated-fssl",
    title="the gated FSSL protocol's validity gates and ordering, per compare directory",
    page="docs/proxyfl.md",
    default_out="runs/proxyfl-gated/b",
    table=table,
    figure=figure,
    options=(
        Option("min_gap", float, 8.0, "gate: all labels − labeled-only must be at least this many points"),
        Option("min_used", float, 0.25, "gate: the share of unlabeled samples a method must use"),
        Option("labels", str, None, "one label per directory (the figure's groups)", nargs="+"),
    ),
    reads="directories written by `fedhet compare proxyfl/fashion-mnist-gated` (one per labeled setting)",
)
