"""Fairness summaries of run directories: best, final and last-K mean of fairness, BCF rates and accuracy.

``fedhet report --fairness [--last K] RUN_OR_COMPARE_DIR...`` prints them, one row per run and a Markdown
table per method (mean ± std over its seeds); any run with rewards qualifies, FedAvg's included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.engine.rundir import read_metrics, read_summary

SUMMARY_KEYS = ("fairness_pearson", "bcf_rate", "bcf_rate_code", "accuracy")
_COLUMN_NAMES = {
    "fairness_pearson": "fairness",
    "bcf_rate": "rate",
    "bcf_rate_code": "rate (code)",
    "accuracy": "acc %",
}


def fairness_summary(lines: Sequence[Mapping[str, Any]], rounds: int | None = None, last: int = 100) -> dict:
    """Best over evaluated rounds, final, and mean over the last ``last`` rounds of fairness, rates, accuracy.

    "Last 100 rounds" = evaluated rounds r > R − 100 (R = ``rounds`` or the last round logged).
    """
    final_round = rounds if rounds is not None else max((int(ln["round"]) for ln in lines), default=0)
    out: dict[str, Any] = {"rounds": final_round, "last_rounds": last}
    for key in SUMMARY_KEYS:
        series = [
            (int(ln["round"]), float(ln[key]))
            for ln in lines
            if isinstance(ln.get(key), int | float) and math.isfinite(float(ln[key]))
        ]
        if not series:
            out[key] = None
            continue
        values = np.array([v for _, v in series])
        tail = np.array([v for r, v in series if r > final_round - last])
        out[key] = {
            "best": float(values.max()),
            "best_round": int(series[int(values.argmax())][0]),
            "final": float(values[-1]) if series[-1][0] == final_round else None,
            f"last{last}_mean": float(tail.mean()) if tail.size else None,
        }
    return out


def fairness_table(runs: Sequence[Path], last: int = 100) -> str:
    """Tab-separated rows (one per run), then a Markdown table per method with mean ± std over its runs."""
    fields = ("best", "final", f"last{last}_mean")
    header = ["run", "method", "seed"] + [f"{k}:{f.split('_')[0]}" for k in SUMMARY_KEYS for f in fields]
    lines = ["\t".join(header)]
    by_method: dict[str, list[list[float]]] = {}
    for run in runs:
        summary = read_summary(run)
        report = fairness_summary(read_metrics(run, missing_ok=True), rounds=summary.get("rounds"), last=last)
        values = []
        for key in SUMMARY_KEYS:
            info = report.get(key) or {}
            values += [math.nan if info.get(f) is None else float(info[f]) for f in fields]
        by_method.setdefault(str(summary.get("method")), []).append(values)
        cells = [run.name, str(summary.get("method")), str(summary.get("seed"))]
        lines.append("\t".join(cells + ["—" if math.isnan(v) else f"{v:.4f}" for v in values]))
    lines.append("")
    cols = [f"{_COLUMN_NAMES[k]} {f.split('_')[0]}" for k in SUMMARY_KEYS for f in fields]
    lines.append("| method | runs | " + " | ".join(cols) + " |")
    lines.append("|---|---|" + "---|" * len(cols))
    for method, rows in by_method.items():
        table = np.array(rows, dtype=float)
        cells = []
        for j, col in enumerate(cols):
            column = table[:, j][~np.isnan(table[:, j])]
            scale = 100.0 if col.startswith("acc") else 1.0
            digits = 2 if col.startswith(("acc", "fairness")) else 3
            if column.size == 0:
                cells.append("—")
            elif column.size == 1:
                cells.append(f"{scale * column[0]:.{digits}f}")
            else:
                cells.append(f"{scale * column.mean():.{digits}f} ± {scale * column.std():.{digits}f}")
        lines.append(f"| {method} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
