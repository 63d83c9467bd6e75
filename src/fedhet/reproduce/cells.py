"""Cell records of the tables: one small JSON file per finished (row, method, seed), kept beside its page.

A result page keeps rows measured in earlier sessions (``--keep-page-rows``), but their runs are gone; their
records stay (``docs/results/cells/<table>/<scale>/<row>/<method>-seed<k>.json``), so a page's findings are
judged from every seed ever measured for it, not only from this session's. A table's record holds the run's
summary views (final, best, last 10 rounds, last 100 evaluations) of every scalar metric, its rounds,
clients and model, and the command that made it, beside the provenance every record of the store holds
(``fedhet.reproduce.store``: experiment fingerprint, results stamp, commits, wall time, machine).
``fedhet reproduce --page`` takes a cell from its record instead of running it again while the store's one
rule holds (:func:`fedhet.reproduce.store.is_reusable`), so a long table fills across sessions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedhet.comparison import VIEW_KEYS
from fedhet.config import ExperimentConfig, load_run_config
from fedhet.engine.rundir import CONFIG_FILE, SUMMARY_FILE, read_metrics, read_summary, run_name
from fedhet.reproduce.spec import Spec
from fedhet.reproduce.store import is_reusable, provenance, read_record, record_path, write_record

VIEWS = tuple(VIEW_KEYS)  # every summary view a table may show
#: Per-round metrics a page reads beyond the summary views (the validity gates of a semi-supervised table),
#: kept in a record as their mean over the rounds that report them.
ROUND_MEANS = ("unlabeled_used_fraction",)


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
    """A record per run of the rows that ran now (read from their summary); returns the files written."""
    written = []
    folders = {spec.row_key(row): row.folder for row in spec.rows}
    for r in results:
        if not (r["available"] and r.get("run_dir")) or r.get("kept"):
            continue
        target = record_dir(cells_dir, spec, scale, folders.get(spec.result_key(r), r["row"]))
        for method in r["methods"]:
            for seed in r["seeds"]:
                run = Path(r["run_dir"]) / run_name(method, seed)
                shape = {key: r.get(key) for key in ("rounds", "clients", "model")}
                path = write_table_record(
                    spec, target, run, r["row"], method, seed, scale=scale, command=command, machine=machine,
                    **shape,
                )  # fmt: skip
                if path is not None:
                    written.append(path)
    return written


def write_table_record(
    spec: Spec,
    target: Path,
    run: Path,
    row: str,
    method: str,
    seed: int,
    *,
    scale: str,
    command: str,
    machine: str,
    rounds: int | None,
    clients: int | None,
    model: str | None,
) -> Path | None:
    """The record of one finished run (``run``: its ``<method>-seed<k>`` folder) in the folder ``target``;
    None when the run has not finished."""
    if not (run / SUMMARY_FILE).is_file():
        return None
    summary = read_summary(run)
    lines = read_metrics(run, missing_ok=True)
    round_means = {
        key: float(sum(values) / len(values))
        for key in ROUND_MEANS
        if (values := [ln[key] for ln in lines if isinstance(ln.get(key), int | float)])
    }
    config = run / CONFIG_FILE
    experiment = load_run_config(config).run_fingerprint() if config.is_file() else None
    record = {
        **provenance(summary, experiment=experiment, machine=machine),
        "table": spec.path.stem,
        "scale": scale,
        "row": row,
        "method": method,
        "seed": seed,
        "views": {view: _scalars(summary.get(view)) for view in VIEWS},
        **({"round_means": round_means} if round_means else {}),
        "rounds": rounds,
        "clients": clients,
        "model": model,
        "command": command,
    }
    return write_record(record_path(target, method, seed), record)


def recorded_summaries(
    cells_dir: Path, spec: Spec, scale: str, row_folder: str, configs: Sequence[ExperimentConfig]
) -> dict[tuple[str, int], dict[str, Any]]:
    """(method, seed) -> a summary rebuilt from its record, for each of ``configs`` (one per method and seed,
    as the run would have it) whose record the store's rule lets stand for the run."""
    out = {}
    folder = record_dir(cells_dir, spec, scale, row_folder)
    for cfg in configs:
        method, seed = cfg.method.name, cfg.seed
        path = record_path(folder, method, seed)
        record = read_record(path)
        if not is_reusable(record, cfg.run_fingerprint(), method):
            continue
        views = record.get("views") or {}
        out[method, seed] = {
            "seed": seed,
            **{view: dict(views.get(view) or {}) for view in VIEWS},
            "wall_time_s": record.get("wall_time_s"),
            "fedhet_commits": [{"commit": c} for c in record.get("commits") or []],
            "from_record": str(path),
        }
    return out


def fill_from_records(spec: Spec, results: list[dict[str, Any]], cells_dir: Path, *, scale: str) -> None:
    """Per-seed values, from the records, for the rows of ``results`` that did not run now (kept rows). A row
    is found by its identity (name, metric and view), never by its name alone: rows may share a name."""
    rows = {spec.row_key(row): row for row in spec.rows}
    for r in results:
        row = rows.get(spec.result_key(r))
        if row is None or (r["available"] and r.get("run_dir")):
            continue
        folder = record_dir(cells_dir, spec, scale, row.folder)
        r["records_dir"] = str(folder)
        metric = r.get("metric") or spec.metric
        view = r.get("view") or row.view or spec.view
        factor = row.scale if row.scale is not None else spec.scale
        for method, values in r["methods"].items():
            per_seed = {}
            for path in sorted(folder.glob(f"{method}-seed*.json")):
                record = read_record(path) or {}
                value = (record.get("views", {}).get(view) or {}).get(metric)
                per_seed[str(record["seed"])] = None if value is None else factor * value
            if per_seed:
                values["per_seed"] = per_seed
