"""Run a table's cells: each row's methods and seeds through :func:`fedhet.comparison.run_comparison`, at a
scale, reusing the runs already finished in the output directory; one result dict per row."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedhet.config import ExperimentConfig, apply_override, load_config, parse_set_args
from fedhet.engine.rundir import run_name
from fedhet.reproduce.spec import Row, Spec


def _data_missing(cfg: ExperimentConfig) -> str:
    """'' if the row's dataset is available here, else a note saying what is missing."""
    from fedhet.data.datasets import dataset_status

    for status in dataset_status(cfg.data.root):
        if status["name"] == cfg.data.dataset:
            return "" if status["available"] else f"{cfg.data.dataset}{DATA_MISSING}"
    return ""


#: How a row whose dataset is not found ends its note ("svhn not available here ...").
DATA_MISSING = " not available here (pass --set data.root=DIR)"


def data_was_missing(note: str) -> bool:
    """Whether a row's "not run" note says its dataset was not found (such a row is not among the rows a page
    could have measured where it was written, :func:`fedhet.reproduce.page.rows_measured`)."""
    return note.endswith(DATA_MISSING)


def rows_without_data(spec: Spec) -> list[str]:
    """Names of the rows that cannot run here: marked unavailable, or their dataset is not found."""
    out = []
    for row in spec.rows:
        if not row.available or _data_missing(row_config(row, [])):
            out.append(row.name)
    return out


def row_config(row: Row, overrides: list[str]) -> ExperimentConfig:
    """The row's config with its own ``set`` overrides, then ``overrides``."""
    return configured(row.config, row.overrides + overrides)


def configured(path: Path, overrides: list[str]) -> ExperimentConfig:
    """The config file at ``path`` with ``--set``-style ``overrides`` applied in order."""
    cfg = load_config(path)
    for key, value in parse_set_args(overrides):
        apply_override(cfg, key, value)
    return cfg


def seed_value(summary: dict[str, Any], view: str, metric: str, factor: float) -> float | None:
    """One run's value of ``metric`` in ``view`` (final / best / last / last_100), × the display factor; None
    if none."""
    value = (summary.get(view) or {}).get(metric)
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return factor * float(value)


def run_spec(
    spec: Spec,
    *,
    seeds: int | None = None,
    overrides: list[str] | None = None,
    rows: str | Sequence[str] | None = None,
    methods: list[str] | None = None,
    out_dir: Path,
    progress=None,
    jobs: int = 1,
    scale: str = "full",
    cells_dir: Path | None = None,
    measure: bool = True,
    record_run: Callable[[Row, ExperimentConfig, str, int, Path], None] | None = None,
    planned: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run the selected rows at ``scale``; one result dict per row with our mean/std and the paper's value
    per method. The scale's overrides come first, ``overrides`` (the user's) after them. ``rows``: the text
    (or texts) a row's name must contain to run; the others are listed as not part of this reproduction.

    Runs already finished in ``out_dir`` are reused (see :func:`fedhet.comparison.run_comparison`), so an
    interrupted reproduction continues where it stopped. With ``cells_dir``, a cell whose record there holds
    the same experiment and code (:func:`fedhet.reproduce.cells.recorded_summaries`) is taken from its record
    and not run; the row's ``recorded`` lists them. With ``measure`` False nothing runs: every row is listed
    as not measured (a page rewritten from the rows it holds, ``--page-only``). ``record_run(row, config,
    method, seed, run_dir)`` is called as each run of a row finishes (its record is written at once: an
    interrupted table keeps every finished cell even when its runs are lost). With a list ``planned`` nothing
    runs either: each row that would run appends what it would take from records and what it would run
    (``fedhet records``).
    """
    from fedhet.comparison import VIEW_KEYS, aggregate_rows, comparison_configs
    from fedhet.reproduce.cells import record_dir, recorded_summaries

    chosen = spec.at_scale(scale)
    wanted_rows = [rows] if isinstance(rows, str) else list(rows or [])  # a row matching any is run
    user = list(overrides or [])
    n_seeds = seeds or chosen.seeds or spec.seeds
    results = []
    done: dict[tuple, tuple[dict[str, Any], Path, dict]] = {}  # rows that share their runs (e.g. two metrics)
    for row in spec.rows:
        wanted = [m for m in (methods or spec.methods) if not row.methods or m in row.methods]
        own = row.scale_overrides.get(scale, [])  # the row's own cuts at this scale, after the scale's
        overrides = [*chosen.overrides, *own, *user]
        note = row.note + (f" At the {scale} scale this row also sets {', '.join(own)}." if own else "")
        entry: dict[str, Any] = {
            "row": row.name,
            "metric": row.metric or spec.metric,
            "view": row.view or spec.view,
            # a row shown in another view than the table's (e.g. the best over rounds beside the mean of
            # the last 100) is for reading: the findings are judged in the table's view only
            "judged": (row.view or spec.view) == spec.view,
            "available": row.available,
            "note": note.strip(),
            "methods": {},
        }
        if not row.available:
            for m in wanted:
                entry["methods"][m] = {"paper": row.paper.get(m)}
            results.append(entry)
            continue
        if not measure:  # nothing runs: no config is read, no dataset looked for (the same on any machine)
            entry.update(available=False, note="not measured yet", left_out=True)
            for m in wanted:
                entry["methods"][m] = {"paper": row.paper.get(m)}
            results.append(entry)
            continue
        base = row_config(row, overrides or [])
        missing = _data_missing(base)
        left_out = bool(wanted_rows) and not any(w.lower() in row.name.lower() for w in wanted_rows)
        if missing or left_out:  # listed, so a page says which rows it lacks and why
            made_with = " ".join(f"--rows {w!r}" for w in wanted_rows)
            note = missing or f"not part of this reproduction (made with {made_with})"
            entry.update(available=False, note=note, left_out=not missing)
            for m in wanted:
                entry["methods"][m] = {"paper": row.paper.get(m)}
            results.append(entry)
            continue
        seed_list = [base.seed + i for i in range(n_seeds)]
        params = {m: {**spec.method_params.get(m, {}), **row.method_params.get(m, {})} for m in wanted}
        slug = row.folder
        if row.warmstart is not None:  # the row's methods start from phase A's models (run below if needed)
            warm_config, warm_method = row.warmstart
            warm_dir = out_dir / f"{slug}-warmstart"
            base.model.init_from = str(warm_dir / f"{warm_method}-seed{{seed}}")
        key = (base.fingerprint(), tuple(wanted), tuple(seed_list), json.dumps(params, sort_keys=True))
        if key not in done:
            while any(d[1] == out_dir / slug for d in done.values()):
                slug += "-b"
            recorded = {}
            if cells_dir is not None:
                configs = comparison_configs(base, wanted, seed_list, params)
                recorded = recorded_summaries(cells_dir, spec, scale, row.folder, configs)
            # the cells without a valid record: every seed of a method that misses one (a sub-grid)
            to_run = [m for m in wanted if any((m, s) not in recorded for s in seed_list)]
            run_seeds = [s for s in seed_list if any((m, s) not in recorded for m in to_run)]
            if planned is not None:  # what would run, and nothing runs
                planned.append(
                    {
                        "rows": [],  # every row these runs serve (rows sharing runs: below)
                        "folder": row.folder,
                        "recorded": sorted(recorded),
                        "to_run": [(m, s) for m in to_run for s in run_seeds],
                        "warm_start": row.warmstart is not None and bool(to_run),
                    }
                )
                done[key] = (planned[-1], out_dir / slug, None)
            else:
                warm = None
                if to_run and row.warmstart is not None:  # phase A first
                    warm = (configured(warm_config, row.overrides + overrides), warm_method, warm_dir)
                ran = _run_cells(
                    row, base, to_run, run_seeds, out_dir / slug, params, warm,
                    progress=progress, jobs=jobs, record_run=record_run,
                )  # fmt: skip
                summaries = {
                    m: [
                        ran[m][run_seeds.index(s)] if m in ran and s in run_seeds else recorded[m, s]
                        for s in seed_list
                    ]
                    for m in wanted
                }
                done[key] = ({r["method"]: r for r in aggregate_rows(summaries)}, out_dir / slug, summaries)
        if planned is not None:
            done[key][0]["rows"].append(row)
            continue
        agg, run_dir, per_run = done[key]
        entry.update(
            {
                "rounds": base.train.rounds,
                "seeds": seed_list,
                "clients": base.data.clients,
                "model": base.model.name,
                "run_dir": str(run_dir),
                # the row's cell records (read for what a page shows beyond the table: validity gates)
                "records_dir": None
                if cells_dir is None
                else str(record_dir(cells_dir, spec, scale, row.folder)),
                # method -> seed -> the wall time and commits of a cell taken from its record, not run now
                "recorded": {
                    m: {
                        str(r["seed"]): {"wall_time_s": r.get("wall_time_s"), "commits": r["fedhet_commits"]}
                        for r in per_run[m]
                        if r.get("from_record")
                    }
                    for m in wanted
                    if any(r.get("from_record") for r in per_run[m])
                },
            }
        )
        view, metric = entry["view"], entry["metric"]
        key_mean, key_std = VIEW_KEYS[view]
        factor = row.scale if row.scale is not None else spec.scale
        for m in wanted:
            mean = agg[m][key_mean].get(metric)
            std = agg[m][key_std].get(metric)
            entry["methods"][m] = {
                "ours": None if mean is None else factor * mean,
                "ours_std": None if std is None else factor * std,
                "defined_seeds": agg[m]["defined"][view].get(metric),  # seeds with a value (None: n/a)
                "paper": row.paper.get(m),
                "diverged": agg[m].get("diverged") or {},  # seed -> round the engine stopped the run in
                # seed -> this view's value (None where the run has none): the claims pair seeds by it
                "per_seed": {str(r["seed"]): seed_value(r, view, metric, factor) for r in per_run[m]},
            }
        results.append(entry)
    return results


def _run_cells(
    row: Row,
    base: ExperimentConfig,
    methods: list[str],
    seeds: list[int],
    row_dir: Path,
    params: dict[str, dict[str, Any]],
    warm: tuple[ExperimentConfig, str, Path] | None,
    *,
    progress: Any,
    jobs: int,
    record_run: Callable[[Row, ExperimentConfig, str, int, Path], None] | None,
) -> dict[str, list[dict[str, Any]]]:
    """Run a row's ``methods`` × ``seeds`` into ``row_dir`` (after phase A, ``warm``: its config, method and
    folder); method -> the run summaries in seed order. With ``record_run``, one seed at a time, each recorded
    as it ends: an interrupted table loses at most the seed in flight (run_comparison returns when all its
    runs are done)."""
    from fedhet.comparison import run_comparison

    ran: dict[str, list[dict[str, Any]]] = {}
    if not methods:
        return ran
    if warm is not None:
        warm_config, warm_method, warm_dir = warm
        run_comparison(warm_config, [warm_method], seeds, warm_dir, progress=progress, jobs=jobs)
    for batch in [[s] for s in seeds] if record_run is not None else [seeds]:
        got = run_comparison(
            base, methods, batch, row_dir, method_params=params, progress=progress, jobs=jobs
        )
        for m, runs in got.items():
            ran.setdefault(m, []).extend(runs)
            for seed in batch if record_run is not None else []:
                record_run(row, base, m, seed, row_dir / run_name(m, seed))
    return ran
