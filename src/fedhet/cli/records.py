"""``fedhet records``: what every result page would cost to regenerate with the code at hand.

    fedhet records [--root DIR] [--json]

For each page under ``docs/results/`` (a table's page, at the scale its first line names, the rows it holds
measured; and the robustness study's page, at 3 seeds), it counts the cells the code at hand would take from
their records (the record store's one rule, ``fedhet.reproduce.store.is_reusable``) and those it would run,
with an estimate of their CPU time: a cell's own record's wall time where one exists (a record the rule no
longer accepts still says what the run took), else the mean of its row's records, else of the page's; "?"
where none exists. Nothing runs and nothing is written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "records",
        help="per result page: cells taken from records, cells to run, and their estimated CPU time",
        description="What regenerating every result page would take with the code at hand: per page, the "
        "cells whose records still stand for their runs and those that would run, with their estimated "
        "CPU time. Runs nothing.",
    )
    p.add_argument("--root", type=Path, default=None, help="the checkout to read (default: fedhet's)")
    p.add_argument("--json", action="store_true", help="one JSON object per page")
    p.set_defaults(func=cmd_records)


def _wall(path: Path) -> float | None:
    from fedhet.reproduce.store import read_record

    value = (read_record(path) or {}).get("wall_time_s")
    return float(value) if isinstance(value, int | float) else None


def _estimate(cells: list[Path], fallback: list[float]) -> float | None:
    """Seconds the cells ``cells`` (record paths) would take: each one's own wall time, else ``fallback``'s
    mean; None where neither exists."""
    total = 0.0
    for path in cells:
        wall = _wall(path)
        if wall is None:
            if not fallback:
                return None
            wall = mean(fallback)
        total += wall
    return total


def table_page(page: Path, cells_dir: Path, spec: Any = None) -> dict[str, Any] | None:
    """The plan of a table's page (None for a page that is not a table's); ``spec``: the table's spec, when
    it is not a shipped table's (found by the name the page's first line gives)."""
    from fedhet.reproduce import load_spec, read_page_rows, row_label, run_spec
    from fedhet.reproduce.page import PAGE_MARK_RE
    from fedhet.reproduce.store import record_path

    first = page.read_text(encoding="utf-8").split("\n", 1)[0]
    mark = PAGE_MARK_RE.match(first)  # the page's first line, as fedhet.reproduce.page writes it
    if not mark:
        return None
    table, scale = mark.group(1), mark.group(2)
    spec = spec or load_spec(table)
    measured = set(read_page_rows(page, spec, scale).lines)  # the rows the page holds measured
    planned: list[dict[str, Any]] = []
    # planned as the page's own command runs it (`fedhet reproduce`'s default --out): a warm-started row's
    # runs name their phase-A models by that folder (model.init_from, part of their fingerprint); planning
    # writes nothing there
    out_dir = Path("runs") / "reproduce" / f"{spec.path.stem}-{scale}"
    run_spec(spec, scale=scale, out_dir=out_dir, cells_dir=cells_dir, planned=planned)
    planned = [p for p in planned if any(row_label(spec, row) in measured for row in p["rows"])]
    reused = sum(len(p["recorded"]) for p in planned)
    to_run = [(p, m, s) for p in planned for m, s in p["to_run"]]
    folder = cells_dir / table / scale
    page_walls = [w for f in folder.rglob("*-seed*.json") if (w := _wall(f)) is not None]
    seconds: float | None = 0.0
    for p in planned:
        row_walls = [w for f in (folder / p["folder"]).glob("*-seed*.json") if (w := _wall(f)) is not None]
        paths = [record_path(folder / p["folder"], m, s) for m, s in p["to_run"]]
        row_seconds = _estimate(paths, row_walls or page_walls)
        seconds = None if seconds is None or row_seconds is None else seconds + row_seconds
    return {
        "page": page.name,
        "scale": scale,
        "from_records": reused,
        "to_run": len(to_run),
        "cpu_hours": None if seconds is None else seconds / 3600,
        "rows_to_run": sorted({row.name for p, _, _ in to_run for row in p["rows"]}),
    }


def robustness_page(root: Path, seeds: int = 3) -> dict[str, Any]:
    """The plan of the robustness study's page at ``seeds`` seeds."""
    from fedhet.reproduce.store import is_reusable, read_record
    from fedhet.studies.base import cell_fingerprints, record_path
    from fedhet.studies.robustness import PAGE, RECORDS, STUDY

    records = root / RECORDS
    reused, paths = 0, []
    for cell in STUDY.cells():
        for seed in range(seeds):
            prints = cell_fingerprints(cell, seed, {})
            for method in cell.methods:
                path = record_path(records, cell, method, seed)
                if is_reusable(read_record(path), prints[method], method):
                    reused += 1
                else:
                    paths.append(path)
    walls = [w for f in records.rglob("*-seed*.json") if (w := _wall(f)) is not None]
    seconds = _estimate(paths, walls)
    return {
        "page": Path(PAGE).name,
        "scale": f"{seeds} seeds",
        "from_records": reused,
        "to_run": len(paths),
        "cpu_hours": None if seconds is None else seconds / 3600,
        "rows_to_run": sorted({str(p.parent.relative_to(records)) for p in paths}),
    }


def cmd_records(args: argparse.Namespace) -> int:
    from fedhet.errors import ConfigError

    root = args.root or Path(__file__).resolve().parents[3]
    results = root / "docs" / "results"
    if not results.is_dir():
        raise ConfigError(f"{root} has no docs/results/ folder; pass --root with a fedhet checkout")
    plans = [plan for page in sorted(results.glob("*.md")) if (plan := table_page(page, results / "cells"))]
    if (results / "robustness.md").is_file():
        plans.append(robustness_page(root))
    if args.json:
        for plan in plans:
            print(json.dumps(plan))
        return 0
    width = max(len(p["page"]) for p in plans) if plans else 4
    print(f"{'page':<{width}}  {'scale':<8}  {'from records':>12}  {'to run':>6}  {'CPU-hours':>9}")
    for p in plans:
        hours = "?" if p["cpu_hours"] is None else f"{p['cpu_hours']:.2f}"
        print(f"{p['page']:<{width}}  {p['scale']:<8}  {p['from_records']:>12}  {p['to_run']:>6}  {hours:>9}")
    total = [p["cpu_hours"] for p in plans]
    known = sum(h for h in total if h is not None)
    unknown = sum(h is None for h in total)
    print(
        f"in all: {sum(p['from_records'] for p in plans)} cells from records, "
        f"{sum(p['to_run'] for p in plans)} to run, about {known:.1f} CPU-hours"
        + (f" plus {unknown} page(s) with no record to estimate from" if unknown else "")
    )
    return 0
