"""The seeds the robustness page leaves out of its paired changes: a seed whose final accuracy is missing
(not finite) in a cell or in the clean run it is paired with has no change
(:func:`fedhet.studies.robustness.paired_changes`), so every mean, interval and verdict over that cell is
over fewer seeds. The page names each such cell and seed (:func:`missing_note`) rather than judge silently
over fewer seeds."""

from __future__ import annotations

import math
from collections.abc import Mapping

from fedhet.studies.robustness import COLUMNS, ROWS, row_name

Found = Mapping[tuple[str, str], Mapping[str, list[float]]]


def missing_seeds(found: Found) -> list[tuple[str, str, int]]:
    """(row, column, seed) of every recorded run whose final accuracy is not finite, in the page's order."""
    out = []
    for behaviour, f in ROWS:
        name = row_name(behaviour, f)
        for column in COLUMNS:
            cell = found[name, column]
            out += [
                (name, column, int(s))
                for s, a in zip(cell["seed"], cell["accuracy"], strict=True)
                if not math.isfinite(float(a))
            ]
    return out


def missing_note(found: Found) -> str:
    """The page's sentence on the seeds left out: none, or each (row, column, seed)."""
    missing = missing_seeds(found)
    if not missing:
        return (
            "Every recorded run has a final accuracy: each change, interval and verdict on this page is over "
            "every seed the cell and its clean run both hold."
        )
    named = "; ".join(f"{row} · {column}, seed {seed}" for row, column, seed in missing)
    return (
        f"**Seeds left out**: {len(missing)} recorded run(s) have no final accuracy (not finite): {named}. "
        "Each change against clean that needs one of them (the cell's own, and for a clean run every "
        "attacked cell of its column and its clean cost) is paired over the remaining seeds, and the "
        "counts of seeds given with the targets say over how many."
    )
