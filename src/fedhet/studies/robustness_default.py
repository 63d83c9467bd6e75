"""The default chosen by measurement (the robustness page's rule): among the defences, those whose clean cost
is within one point, and among them the one whose worst attacked change is smallest; then the targets no
defence within that budget meets.

- **Defences**: the FedAvg columns of :data:`fedhet.studies.robustness.COLUMNS` (FedAvg as published, the
  guards' variants, each robust rule), not Flower's (the same rules computed by Flower) and not the
  contribution methods (CELM, CGSV, ShapFed, FedRAC: each is a method chosen for what it computes, not a
  setting fedhet could make its default for every method).
- **Within one point**: the clean change against FedAvg as published, paired by seed, judged on its 95 %
  Student-t interval (:func:`fedhet.verdicts.judge_margin`, margin 1 point) as the page's other targets are:
  only a column that **meets** the budget is a candidate; one the seeds cannot resolve is named, not picked.
  A column not measured on every attacked row is named, not picked (its worst change covers fewer attacks).
- **Smallest worst change**: lexicographic, the worst mean change at f = 3 first, then at f = 1 (three
  colluders are where the defences differ most; a tie there is broken by one attacker), then the column's
  order on the page.
- **Targets none meets**: each attacked row whose accuracy target (:data:`TARGET_DROP`) no candidate meets,
  with the candidate whose mean change is the largest there, its interval and its verdict (missed: the
  interval lies below the target; not resolved: the seeds cannot tell).

Computed from the collected cells, so from the records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fedhet.studies.robustness import (
    ATTACKS,
    COLUMNS,
    FLOWER_COLUMNS,
    HOSTILE,
    TARGET_DROP,
    column_rows,
    drop_verdict,
    paired_changes,
    row_name,
)
from fedhet.studies.robustness_tradeoff import points
from fedhet.verdicts import CONTRADICTED, HOLDS, MEETS, MISSES, UNRESOLVED, judge, judge_margin

#: the clean-cost budget, in points of accuracy against FedAvg as published
BUDGET = 1.0
#: the column every clean cost is measured against, and the column of fedhet's current defaults
BASELINE, CURRENT = "FedAvg", "FedAvg, defaults"
Found = Mapping[tuple[str, str], Mapping[str, list[float]]]


@dataclass(frozen=True)
class Choice:
    """The rule's outcome: the picked column (None when no defence is within the budget), the candidates
    (within the budget) with their worst (attack, mean change) by f, the columns left out and why, and the
    targets no candidate meets as (row, f, best column, verdict, mean, low, high)."""

    picked: str | None
    candidates: dict[str, dict[int, tuple[str, float]]]
    left_out: dict[str, str]
    unmet: list[tuple[str, int, str, str, float, float, float]]


def defences() -> list[str]:
    """The FedAvg-family columns in the page's order, Flower's left out (see the module docstring)."""
    return [
        c for c, (_, method) in COLUMNS.items() if method == "fedavg" and c not in FLOWER_COLUMNS.values()
    ]


def choose(found: Found) -> Choice:
    """Apply the rule of the module docstring to the collected cells."""
    base = found["clean", BASELINE]
    candidates: dict[str, dict[int, tuple[str, float]]] = {}
    left_out: dict[str, str] = {}
    worst = {p.column: p.worst for p in points(found)}  # the trade-off table's worst changes
    attacked = 2 * len(ATTACKS)
    for column in defences():
        clean = found["clean", column]
        if not clean["accuracy"]:
            left_out[column] = "not measured"
            continue
        rows = [r for r in column_rows(column) if r[0] != "clean" and found[row_name(*r), column]["accuracy"]]
        if len(rows) < attacked:
            left_out[column] = f"measured on {len(rows)} of the {attacked} attacked rows"
            continue
        verdict, mean, low, high = judge_margin(paired_changes(clean, base), BUDGET)
        if verdict != MEETS:
            span = f"[{low:+.2f}, {high:+.2f}]" if math.isfinite(low) else "(one seed: no interval)"
            left_out[column] = f"clean cost {verdict} within {BUDGET:g} point: {mean:+.2f} {span}"
            continue
        candidates[column] = worst[column]
    order = list(candidates)

    def key(column: str) -> tuple[float, ...]:  # smaller is better: minus the worst change, f = 3 first
        at = candidates[column]
        return (
            *(-at[f][1] if f in at else float("inf") for f in sorted(HOSTILE, reverse=True)),
            order.index(column),
        )

    picked = min(order, key=key) if order else None
    unmet = []
    for f in HOSTILE:
        for behaviour in ATTACKS:
            name = row_name(behaviour, f)
            judged = {
                c: drop_verdict(found[name, c], found["clean", c], TARGET_DROP[f])
                for c in order
                if paired_changes(found[name, c], found["clean", c])
            }
            if judged and not any(v[0] == MEETS for v in judged.values()):
                best = max(judged, key=lambda c: judged[c][1])
                unmet.append((name, f, best, *judged[best]))
    return Choice(picked, candidates, left_out, unmet)


def against_current(found: Found, choice: Choice) -> list[tuple[str, str, float, float | None, float | None]]:
    """Where the rule picks another column than fedhet's current default (both within the budget): on the
    current default's worst row at each f (f = 3 first), (row, verdict, mean, low, high) of the paired
    accuracy differences pick − current, in points (:func:`fedhet.verdicts.judge`: holds when the pick is
    better there on the 95 % interval, contradicted when worse, else not resolved)."""
    if choice.picked is None or choice.picked == CURRENT or CURRENT not in choice.candidates:
        return []
    out = []
    for f in sorted(choice.candidates[CURRENT], reverse=True):
        name = row_name(choice.candidates[CURRENT][f][0], f)
        current = found[name, CURRENT]
        by_seed = dict(zip(current["seed"], current["accuracy"], strict=True))
        picked = found[name, choice.picked]
        diffs = [
            100 * (a - by_seed[s])
            for s, a in zip(picked["seed"], picked["accuracy"], strict=True)
            if s in by_seed and math.isfinite(a) and math.isfinite(by_seed[s])
        ]
        if diffs:
            verdict, low, high = judge(diffs)
            out.append((name, verdict, sum(diffs) / len(diffs), low, high))
    return out


def default_lines(found: Found) -> list[str]:
    """The rule's verdict as the page's paragraph and list."""
    choice = choose(found)
    lines = []
    if choice.picked is None:
        lines.append(f"No defence costs within {BUDGET:g} point of clean accuracy on these cells.")
    else:
        worst = choice.candidates[choice.picked]
        at = "; ".join(f"f = {f}: {worst[f][1]:+.1f} ({worst[f][0]})" for f in sorted(worst, reverse=True))
        current = (
            "it is fedhet's current default"
            if choice.picked == CURRENT
            else f"it is not fedhet's current default ({CURRENT})"
        )
        lines.append(f"**The rule picks {choice.picked}** (worst change {at}); {current}.")
        compared = against_current(found, choice)
        if compared:
            said = {HOLDS: "better there", CONTRADICTED: "worse there", UNRESOLVED: "the seeds cannot tell"}
            parts = [
                f"{name} {mean:+.1f}"
                + (f" [{low:+.1f}, {high:+.1f}]" if low is not None else "")
                + f", {said[v]}"
                for name, v, mean, low, high in compared
            ]
            lines.append(
                f"Its accuracy against {CURRENT}, paired by seed (points, 95 % interval), on the rows where "
                f"{CURRENT} does worst: " + "; ".join(parts) + "."
            )
    lines.append("")
    for column, worst in choice.candidates.items():
        at = "; ".join(f"f = {f}: {worst[f][1]:+.1f} ({worst[f][0]})" for f in sorted(worst, reverse=True))
        lines.append(f"- within the budget: {column} (worst change {at})")
    for column, why in choice.left_out.items():
        lines.append(f"- left out: {column} ({why})")
    lines.append("")
    if choice.unmet:
        lines.append(
            f"Targets no defence within the budget meets ({len(choice.unmet)} of {2 * len(ATTACKS)} attacked "
            "rows; the candidate with the largest mean change there, its change [95 % interval] in points, "
            "and why):"
        )
        lines.append("")
        for name, f, best, verdict, mean, low, high in choice.unmet:
            if verdict == MISSES:
                why = "missed: the interval lies below the target"
            elif math.isfinite(low):
                why = "not resolved: the interval straddles the target"
            else:
                why = "not resolved: one seed, no interval"
            lines.append(
                f"- {name} (target −{TARGET_DROP[f]:g}): {best} {mean:+.1f} [{low:+.1f}, {high:+.1f}], {why}"
            )
    elif choice.candidates:
        lines.append("Every attacked row's accuracy target is met by at least one defence within the budget.")
    return lines
