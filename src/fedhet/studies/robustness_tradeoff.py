"""What each defence costs and what it holds (the robustness page's trade-off): per column of
:mod:`fedhet.studies.robustness`, its clean cost (its clean accuracy against FedAvg as published, paired by
seed) against its worst attacked change (the largest accuracy drop over the measured attacked rows at f = 1
and at f = 3, each against the column's own clean run, paired by seed), as a table and a figure.

Computed from the collected cells (:func:`fedhet.studies.robustness.collect`), so from the records; the
columns computed by Flower's own strategies are left out (they are the anchors of fedhet's rules, the same
rules again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhet.studies.robustness import (
    ATTACKS,
    COLUMNS,
    FLOWER_COLUMNS,
    HOSTILE,
    column_rows,
    paired_changes,
    row_name,
)

#: the figure's file name, beside the page's other figure (docs/figures/)
TRADEOFF_FIGURE = "robustness-tradeoff.png"
#: the column every clean cost is measured against: FedAvg as published, no guard
BASELINE = "FedAvg"
Found = Mapping[tuple[str, str], Mapping[str, list[float]]]


@dataclass(frozen=True)
class Point:
    """One column: its clean cost and, per f, its worst attacked row and change (points; NaN unmeasured)."""

    column: str
    clean_cost: float
    worst: dict[int, tuple[str, float]]
    rows: int  # attacked rows measured


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def points(found: Found) -> list[Point]:
    """The trade-off of every column but Flower's (see the module docstring), in the page's column order."""
    base = found["clean", BASELINE]
    out = []
    for column in COLUMNS:
        if column in FLOWER_COLUMNS.values():
            continue
        clean = found["clean", column]
        if not clean["accuracy"]:
            continue
        worst: dict[int, tuple[str, float]] = {}
        measured = 0
        for f in HOSTILE:
            changes = {
                behaviour: _mean(paired_changes(found[row_name(behaviour, f), column], clean))
                for behaviour in ATTACKS
                if (behaviour, f) in column_rows(column) and found[row_name(behaviour, f), column]["accuracy"]
            }
            changes = {b: c for b, c in changes.items() if np.isfinite(c)}
            measured += len(changes)
            if changes:
                attack = min(changes, key=lambda b: changes[b])
                worst[f] = (attack, changes[attack])
        out.append(Point(column, _mean(paired_changes(clean, base)), worst, measured))
    return out


def _worst_text(point: Point, f: int) -> str:
    if f not in point.worst:
        return "–"
    attack, change = point.worst[f]
    return f"{change:+.1f} ({attack})"


def tradeoff_lines(found: Found) -> list[str]:
    """The trade-off as a Markdown table and the sentence saying what it shows."""
    rows = [
        "| column | clean cost against FedAvg | worst change at f = 1 | worst change at f = 3 |",
        "|---|---|---|---|",
    ]
    for p in points(found):
        note = f" ({p.rows} attacked rows)" if p.rows < 2 * len(ATTACKS) else ""
        rows.append(f"| {p.column}{note} | {p.clean_cost:+.2f} | {_worst_text(p, 1)} | {_worst_text(p, 3)} |")
    return [
        *rows,
        "",
        "Clean cost: the column's clean accuracy minus FedAvg's (as published, no guard), in points, mean "
        "over the seeds both hold (paired by seed). Worst change: the most negative mean accuracy change "
        "against the column's own clean run over the attacked rows measured at that f, with the attack "
        "(a column measured on some rows only says how many). Flower's columns, the same rules computed by "
        "Flower, are left out.",
    ]


def draw_tradeoff(found: Found, path: Path) -> Path:
    """The trade-off as a figure: one panel per f, clean cost (x) against the worst change (y)."""
    from fedhet.report.figures import new_figure, save_figure

    shown = points(found)
    fig = new_figure(13, 5.5)
    axes = fig.subplots(1, len(HOSTILE), sharex=True)
    for ax, f in zip(axes, HOSTILE, strict=True):
        for p in shown:
            if f not in p.worst or not np.isfinite(p.clean_cost):
                continue
            marker = (
                "s" if p.column.startswith("CELM") else "o" if p.column.startswith(("FedAvg", "+")) else "^"
            )
            ax.scatter(p.clean_cost, p.worst[f][1], marker=marker, s=28)
            ax.annotate(
                p.column, (p.clean_cost, p.worst[f][1]), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
        ax.axvline(-1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("clean cost against FedAvg (points)")
        ax.set_ylabel("worst attacked change against clean (points)")
        ax.set_title(f"f = {f} hostile of 10")
        ax.grid(alpha=0.3)
    fig.suptitle("Each column's clean cost against its worst attacked change (dashed: 1 point of clean cost)")
    return save_figure(fig, path)
