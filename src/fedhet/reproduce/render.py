"""Render a table's results: the Markdown table (ours ± std / paper / Δ per cell), its validity gates, and the
reproduce.md / .csv / .json written beside the runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.reproduce.claims import findings_section
from fedhet.reproduce.spec import Row, Spec


def _cell(v: dict[str, Any], seeds: int = 2) -> str:
    """``ours ± std / paper ± std / Δ``; one seed has no std, so none is shown. A metric with no value in
    some seeds (Pearson of equal rewards) says in how many it had one, or that it had none."""
    ours, paper = v.get("ours"), v.get("paper")
    defined = v.get("defined_seeds")
    parts = []
    if ours is not None and math.isfinite(ours):
        n = seeds if defined is None else defined
        mean = f"**{ours:.2f}" + (f" ± {v.get('ours_std') or 0:.2f}**" if n > 1 else "**")
        parts.append(mean + (f" (a value in {n} of {seeds} seeds)" if n < seeds else " (1 seed)" * (n == 1)))
    else:
        parts.append("undefined in every seed" if defined == 0 else "—")
    if paper is not None:
        p, ps = paper
        parts.append(f"paper {p:.2f}" + (f" ± {ps:.2f}" if ps is not None else ""))
        if ours is not None and math.isfinite(ours):
            parts.append(f"Δ {ours - p:+.2f}")
    diverged = v.get("diverged") or {}
    if diverged:  # its views are the global model at the stop (see the note under the table)
        rounds = ", ".join(str(r) for _, r in sorted(diverged.items()))
        parts.append(f"diverged in {len(diverged)} of {seeds} seeds (stopped in round {rounds})")
    return " / ".join(parts)


def finding_unit(spec: Spec) -> str:
    """What a paired difference is measured in, for the findings' sentence."""
    if any(row.scale is not None and row.scale != spec.scale for row in spec.rows):
        return "the units of each row's cells"
    return "points" if spec.scale == 100 else f"`{spec.metric}` × {spec.scale:g}"


def render_markdown(
    spec: Spec, results: list[dict[str, Any]], scale: str | None = None, findings: bool = True
) -> str:
    """A Markdown table: one row per table row, a cell per method with ours / paper / difference; led by the
    findings' verdicts unless ``findings`` is False (a result page prints them itself, at its top)."""
    methods = sorted({m for r in results for m in r["methods"]}, key=lambda m: (spec.methods + [m]).index(m))
    lines = [f"## {spec.title}", ""]
    verdicts = findings_section(spec.claims, results, finding_unit(spec)) if findings else []
    if verdicts:
        lines += [*("#" + line if line.startswith("## ") else line for line in verdicts), ""]
    source = f"Source: {spec.source}. " if spec.source else ""
    lines += [f"{source}Metric: `{spec.metric}` ({spec.view}), ×{spec.scale:g}.", ""]
    if spec.overrides:
        every = " ".join(f"`--set {o}`" for o in spec.overrides)
        lines += [f"Every row runs with {every} (the table's own settings; see its notes).", ""]
    if scale:
        chosen = spec.at_scale(scale)
        lines += [
            f"Scale: **{scale}**: {chosen.note}. Each row's rounds, clients, seeds and model are in its "
            "columns.",
            "",
        ]
    lines += [
        "| row | rounds | clients | seeds | model | " + " | ".join(methods) + " |",
        "|---|---|---|---|---|" + "---|" * len(methods),
    ]
    for r in results:
        if r.get("kept"):  # measured earlier, kept from the page as it was (--keep-page-rows)
            lines.append(r["kept"]["line"])
            continue
        name = labelled(spec, r["row"], r.get("metric") or spec.metric, r.get("view"))
        if not r["available"]:
            cells = [
                (f"paper {v['paper'][0]:.2f}" if v.get("paper") else "—")
                for v in (r["methods"].get(m, {}) for m in methods)
            ]
            lines.append(f"| {name} | — | — | — | — | " + " | ".join(cells) + f" |  ← not run: {r['note']}")
            continue
        cells = [_cell(r["methods"].get(m, {}), len(r["seeds"])) for m in methods]
        shape = f"{r['rounds']} | {r.get('clients', '—')} | {len(r['seeds'])} | {r.get('model', '—')}"
        lines.append(f"| {name} | {shape} | " + " | ".join(cells) + " |")
    # a note names its row; where rows share a name (one per metric or view), by its label
    shared = {name for name in (r["row"] for r in results) if sum(x["row"] == name for x in results) > 1}

    def noted_as(r: dict[str, Any]) -> str:
        if r["row"] not in shared:
            return r["row"]
        return labelled(spec, r["row"], r.get("metric") or spec.metric, r.get("view"))

    noted = [
        r["kept"]["note"] if r.get("kept") else f"- {noted_as(r)}: {r['note']}"
        for r in results
        if (r.get("kept") or {}).get("note") or (r["available"] and r.get("note"))
    ]
    if noted:
        lines += [""] + noted
    if any(v.get("diverged") for r in results for v in r["methods"].values()):
        lines += [
            "",
            "*Diverged*: the engine stopped that seed's run when every update of several consecutive "
            "rounds was unusable (non-finite or rejected by the guards, `guards.max_all_rejected_rounds`); "
            "its value is the global model evaluated at the stop, the model the run would end with.",
        ]
    if spec.notes:
        lines += ["", spec.notes.strip()]
    diffs = [
        v["ours"] - v["paper"][0]
        for r in results
        for v in r["methods"].values()
        if r["available"] and v.get("paper") and v.get("ours") is not None and math.isfinite(v["ours"])
    ] + [d for r in results if r.get("kept") for d in r["kept"]["diffs"]]  # kept rows: Δ as printed
    if diffs:
        lines += ["", f"Mean |Δ| over {len(diffs)} cells: {np.mean(np.abs(diffs)):.2f}."]
    lines += gates_section(spec, results)
    return "\n".join(lines) + "\n"


#: How the validity gates of a row begin on a page (followed by the row's name).
GATES_HEADING = "### Validity gates: "


def row_records(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The cell records of a row's methods at its seeds (none where the row names no records folder)."""
    from fedhet.reproduce.store import read_record

    folder = result.get("records_dir")
    if not folder or not Path(folder).is_dir():
        return []
    seeds = {str(s) for s in result.get("seeds") or []}
    seeds |= {s for values in result["methods"].values() for s in (values.get("per_seed") or {})}
    found = [read_record(p) for p in sorted(Path(folder).glob("*-seed*.json"))]
    return [r for r in found if r and r.get("method") in result["methods"] and str(r.get("seed")) in seeds]


def gates_section(spec: Spec, results: list[dict[str, Any]]) -> list[str]:
    """The table's validity gates per measured row (``gates = "fssl"``), from the row's cell records where
    they hold the per-round unlabeled-use figures (``round_means``), else from its runs; a row kept from the
    page whose records lack those figures (recorded before records kept them) keeps its gates as printed.
    Rows that share a name (and their runs) print them once."""
    if spec.gates != "fssl":
        return []
    from fedhet.report.fssl_gates import fssl_gates, fssl_inputs_from_records, gates_markdown, read_fssl_runs

    lines: list[str] = []
    done: set[str] = set()
    for r in results:
        if r["row"] in done:
            continue
        records = row_records(r)
        if not any("round_means" in record for record in records):
            records = []
        if not records and (r.get("kept") or {}).get("gates"):
            done.add(r["row"])
            lines += ["", *r["kept"]["gates"]]
            continue
        if not records and (not r["available"] or not r.get("run_dir")):
            continue
        done.add(r["row"])
        lines += ["", f"{GATES_HEADING}{r['row']}", ""]
        try:
            inputs = fssl_inputs_from_records(records) if records else read_fssl_runs(Path(r["run_dir"]))
            lines.append(gates_markdown(fssl_gates(*inputs)).rstrip())
        except ValueError as exc:  # a run of only some methods (--methods): the gates need all five
            lines.append(f"Not computed: {exc}.")
    return lines


def write_results(spec: Spec, results: list[dict[str, Any]], out_dir: Path, scale: str | None = None) -> Path:
    """Write reproduce.json, reproduce.md and reproduce.csv into ``out_dir``; the path of the Markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "reproduce.json").write_text(
        json.dumps(
            {"spec": str(spec.path), "title": spec.title, "scale": scale, "results": results},
            indent=2,
            default=str,
        )
    )
    md = out_dir / "reproduce.md"
    md.write_text(render_markdown(spec, results, scale=scale))
    write_results_csv(results, out_dir / "reproduce.csv")
    return md


def write_results_csv(results: list[dict[str, Any]], path: Path) -> Path:
    """One line per (table row, method): ours (mean, std over seeds), the paper's value and the difference."""
    import csv

    columns = [
        "row",
        "method",
        "metric",
        "rounds",
        "seeds",
        "ours",
        "ours_std",
        "paper",
        "paper_std",
        "delta",
        "diverged_seeds",
    ]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for r in results:
            for method, v in r["methods"].items():
                ours, paper = v.get("ours"), v.get("paper")
                has_ours = ours is not None and math.isfinite(ours)
                writer.writerow(
                    {
                        "row": r["row"],
                        "method": method,
                        "metric": r.get("metric"),
                        "rounds": r.get("rounds"),
                        "seeds": " ".join(map(str, r.get("seeds") or [])),
                        "ours": ours if has_ours else None,
                        "ours_std": v.get("ours_std") if has_ours else None,
                        "paper": paper[0] if paper else None,
                        "paper_std": paper[1] if paper else None,
                        "delta": ours - paper[0] if paper and has_ours else None,
                        "diverged_seeds": " ".join(map(str, sorted(v.get("diverged") or {}))),
                    }
                )
    return path


def labelled(spec: Spec, name: str, metric: str, view: str | None = None) -> str:
    """A row's name as its table line prints it: with its metric and view where they are not the table's."""
    own = [metric] if metric != spec.metric else []
    own += [VIEW_NAMES.get(view, view)] if view and view != spec.view else []
    return name + (f" ({', '.join(own)})" if own else "")


#: How a row whose view is not its table's names it.
VIEW_NAMES = {
    "final": "final",
    "best": "best",
    "last": "mean of the last 10 rounds",
    "last_100": "mean of the last 100",
}


def row_label(spec: Spec, row: Row) -> str:
    """The label ``render_markdown`` prints for ``row`` (how a kept row is found on a page)."""
    return labelled(spec, row.name, row.metric or spec.metric, row.view)
