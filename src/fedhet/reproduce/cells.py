"""Cell records: one small JSON file per finished (row, method, seed) of a table, kept beside its result page.

A result page keeps rows measured in earlier sessions (``--keep-page-rows``), but their runs are gone; their
records stay (``docs/results/cells/<table>/<scale>/<row>/<method>-seed<k>.json``), so a page's findings are
judged from every seed ever measured for it, not only from this session's. A record holds the run's summary
views (final, best, last-10) of every scalar metric, its rounds, clients and model, the commits that computed
it, its wall time and the command that made it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fedhet.reproduce.spec import Spec

VIEWS = ("final", "best", "last")


def record_dir(cells_dir: Path, spec: Spec, scale: str, row_folder: str) -> Path:
    return cells_dir / spec.path.stem / scale / row_folder


def _scalars(view: dict[str, Any] | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, value in (view or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float | type(None)):
            continue
        out[key] = None if value is None or not math.isfinite(value) else float(value)
    return out


def write_records(
    spec: Spec, results: list[dict[str, Any]], cells_dir: Path, *, scale: str, command: str, machine: str
) -> list[Path]:
    """A record per run of the rows that ran now (read from their summary.json); returns the files written."""
    written = []
    folders = {row.name: row.folder for row in spec.rows}
    for r in results:
        if not (r["available"] and r.get("run_dir")) or r.get("kept"):
            continue
        target = record_dir(cells_dir, spec, scale, folders.get(r["row"], r["row"]))
        for method in r["methods"]:
            for seed in r["seeds"]:
                source = Path(r["run_dir"]) / f"{method}-seed{seed}" / "summary.json"
                if not source.is_file():
                    continue
                summary = json.loads(source.read_text())
                record = {
                    "table": spec.path.stem,
                    "scale": scale,
                    "row": r["row"],
                    "method": method,
                    "seed": seed,
                    "views": {view: _scalars(summary.get(view)) for view in VIEWS},
                    "rounds": r.get("rounds"),
                    "clients": r.get("clients"),
                    "model": r.get("model"),
                    "commits": [c["commit"] for c in summary.get("fedhet_commits") or [] if c.get("commit")]
                    or [summary.get("fedhet_commit")],
                    "wall_time_s": summary.get("wall_time_s"),
                    "command": command,
                    "machine": machine,
                }
                target.mkdir(parents=True, exist_ok=True)
                path = target / f"{method}-seed{seed}.json"
                path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
                written.append(path)
    return written


def fill_from_records(spec: Spec, results: list[dict[str, Any]], cells_dir: Path, *, scale: str) -> None:
    """Per-seed values, from the records, for the rows of ``results`` that did not run now (kept rows)."""
    rows = {row.name: row for row in spec.rows}
    for r in results:
        row = rows.get(r["row"])
        if row is None or (r["available"] and r.get("run_dir")):
            continue
        folder = record_dir(cells_dir, spec, scale, row.folder)
        metric = r.get("metric") or spec.metric
        factor = row.scale if row.scale is not None else spec.scale
        for method, values in r["methods"].items():
            per_seed = {}
            for path in sorted(folder.glob(f"{method}-seed*.json")):
                record = json.loads(path.read_text())
                value = (record.get("views", {}).get(spec.view) or {}).get(metric)
                per_seed[str(record["seed"])] = None if value is None else factor * value
            if per_seed:
                values["per_seed"] = per_seed
