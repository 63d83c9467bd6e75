"""Several methods on the same splits and seeds (the engine of `fedhet compare` and `fedhet reproduce`).

Every (method, seed) run lands in ``out_dir/<method>-seed<k>``. A comparison is resumable: a run whose
``summary.json`` exists and whose ``config.toml`` describes the same experiment (every key but the thread
count, :meth:`ExperimentConfig.run_fingerprint`) is read back instead of rerun, and an unfinished run with a
checkpoint of the same experiment resumes from it. Runs can be
spread over worker processes (``jobs``); every run is seeded on its own, so the metrics do not depend on
the number of workers.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import queue
import signal
import threading
from collections.abc import Callable
from concurrent.futures import as_completed
from dataclasses import dataclass
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.algorithms import accepted_params, build_strategy, strategy_class
from fedhet.config import ExperimentConfig, apply_override, load_run_config
from fedhet.engine import checkpoint as ckpt
from fedhet.engine.rundir import (
    CONFIG_FILE,
    SUMMARY_FILE,
    make_dirs,
    read_summary,
    remove_empty_dirs,
    run_dir_state,
    run_name,
)
from fedhet.engine.warm_start import recorded_warm_start, warm_start_digest
from fedhet.errors import FedhetError, RunDirectoryError, TrainingDivergedError, option
from fedhet.experiment import (
    apply_method_defaults,
    cached_standalone_accuracies,
    make_simulation,
    needs_reference,
    prepass_notice,
    reference_reason,
    standalone_accuracies,
    standalone_key,
    store_standalone_accuracies,
)
from fedhet.process_pool import FreshProcessPool

log = logging.getLogger("fedhet.comparison")

#: progress(description, total_rounds) -> per-round callback, or None for no progress display
ProgressFactory = Callable[[str, int], Callable[..., None]] | None

#: the per-round fields a worker process sends back for the progress display
_PROGRESS_FIELDS = ("accuracy", "fairness_pearson")


def method_config(
    base: ExperimentConfig, method: str, seed: int, params: dict[str, Any] | None = None
) -> ExperimentConfig:
    """``base`` for one method and seed: base method params the method accepts, plus its own ``params``."""
    cfg = base.copy()
    apply_override(cfg, "seed", seed)
    cfg.method.name = method
    accepted = accepted_params(strategy_class(method))
    shared = {k: v for k, v in base.method.params.items() if k in accepted}
    cfg.method.params = {**shared, **(params or {})}
    return cfg


def comparison_configs(
    base: ExperimentConfig,
    methods: list[str],
    seeds: list[int],
    method_params: dict[str, dict[str, Any]] | None = None,
) -> list[ExperimentConfig]:
    """Every (method, seed) cell's config as :func:`run_comparison` runs it (the method defaults applied to a
    copy of ``base``), seed-major."""
    method_params = method_params or {}
    shared = base.copy()
    with_method_defaults(shared, methods, method_params)
    return [method_config(shared, m, s, method_params.get(m)) for s in seeds for m in methods]


def with_method_defaults(
    base: ExperimentConfig, methods: list[str], method_params: dict[str, dict[str, Any]]
) -> tuple[list[Any], list[str]]:
    """The methods' strategies, with their config defaults applied to ``base`` in place (one split and one
    model for every method of a comparison); returns the strategies and one notice per change."""
    configs = [method_config(base, m, base.seed, method_params.get(m)) for m in methods]
    strategies = [build_strategy(m, c.method.params) for m, c in zip(methods, configs, strict=True)]
    return strategies, apply_method_defaults(base, strategies)


def _needs_standalone(cfg: ExperimentConfig, auto: bool | None = None) -> bool:
    return needs_reference(cfg, build_strategy(cfg.method.name, cfg.method.params), auto=auto)


def comparison_measures_fairness(strategies: list[Any], configs: list[ExperimentConfig]) -> bool:
    """Whether a comparison measures fairness under ``eval.fairness = "auto"``: when one of its methods does
    by default (``Strategy.fairness_by_default``) or takes the standalone accuracies as an input; then every
    method with rewards gets fairness columns too (FedAvg beside FedRAC), from the same pre-pass."""
    return any(needs_reference(cfg, strategy) for cfg, strategy in zip(configs, strategies, strict=True))


@dataclass
class PlannedRun:
    """One (method, seed) cell of a comparison."""

    method: str
    seed: int
    cfg: ExperimentConfig
    run_dir: Path
    needs_standalone: bool
    #: resume from a checkpoint of the same experiment when the run directory holds one
    may_resume: bool = True

    @property
    def label(self) -> str:
        return f"{self.method} seed {self.seed}"

    @property
    def standalone_label(self) -> str:
        return f"standalone seed {self.seed} (for fairness)"

    @property
    def provides_standalone(self) -> bool:
        """Whether this cell is itself the standalone run that fairness metrics need (a 'standalone'
        cell without client dropout, which the standalone cache ignores)."""
        cls = strategy_class(self.method)
        return cls.rewards_are_reference and not self.cfg.method.params and self.cfg.train.client_dropout == 0


def remember_standalone(run: PlannedRun, summary: dict[str, Any]) -> None:
    """Let a finished 'standalone' cell fill the standalone cache, so it is not trained twice."""
    if run.provides_standalone and summary.get("rewards"):
        store_standalone_accuracies(run.cfg, summary["rewards"])


def _same_run(cfg: ExperimentConfig, config_file: Path) -> bool:
    """Whether ``config_file`` (a run's config.toml) describes the same experiment as ``cfg``; for a run
    started from another run's model (``model.init_from``), also from the same weights as that run holds now
    (a run that did not record them, from before the record existed, is taken as the same)."""
    try:
        if load_run_config(config_file).run_fingerprint() != cfg.run_fingerprint():
            return False
    except FedhetError:
        return False
    if not cfg.model.init_from:
        return True
    recorded = recorded_warm_start(config_file.parent)
    return recorded is None or recorded == warm_start_digest(cfg.model.init_from.format(seed=cfg.seed))


def finished_summary(cfg: ExperimentConfig, run_dir: Path) -> dict[str, Any] | None:
    """The summary of a finished run of the same experiment as ``cfg`` in ``run_dir``, or None."""
    summary, config = run_dir / SUMMARY_FILE, run_dir / CONFIG_FILE
    if not (summary.is_file() and config.is_file()) or not _same_run(cfg, config):
        return None
    try:
        return read_summary(run_dir)
    except json.JSONDecodeError:
        log.warning("%s is unreadable: rerunning %s", summary, run_dir.name)
        return None


def resumable(cfg: ExperimentConfig, run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint of an unfinished run of the same experiment as ``cfg``."""
    config = run_dir / CONFIG_FILE
    if not config.is_file() or ckpt.latest_checkpoint(run_dir) is None:
        return False
    return _same_run(cfg, config)


def conflicting_cells(plan: list[PlannedRun]) -> list[str]:
    """The cells whose directory holds a run (finished or not) of a different experiment, or other files."""
    out = []
    for run in plan:
        state = run_dir_state(run.run_dir)
        if state == "empty":
            continue
        config = run.run_dir / CONFIG_FILE
        if state == "foreign" or not config.is_file() or not _same_run(run.cfg, config):
            why = "not a fedhet run" if state == "foreign" else f"{state}, another configuration"
            out.append(f"{run.run_dir} ({why})")
    return out


def execute_run(
    run: PlannedRun, standalone: np.ndarray | None, progress: Callable[..., None] | None = None
) -> dict[str, Any]:
    """Run one cell, resuming from its checkpoint when it has one of the same configuration.

    A cell whose run diverged (the engine stopped it: no update of several rounds could be used) is a
    result, not a failure of the comparison: its summary is marked ``diverged`` and the others go on.
    """
    resume = run.may_resume and resumable(run.cfg, run.run_dir)
    if resume:
        log.info("resuming %s from its last checkpoint", run.label)
    # The comparison has already decided this cell is to be (re)run (run_comparison refuses cells that
    # hold another experiment unless asked to rerun): what is left of an earlier attempt is replaced.
    simulation = make_simulation(
        run.cfg,
        run_dir=run.run_dir,
        progress=progress,
        reference_contributions=standalone,
        resume=resume,
        overwrite=not resume,
    )
    try:
        return simulation.run()
    except TrainingDivergedError as exc:
        if exc.summary is None:
            raise
        log.warning(
            "%s diverged and stopped in round %s; reported as diverged: %s", run.label, exc.round, exc
        )
        return exc.summary


def run_comparison(
    base: ExperimentConfig,
    methods: list[str],
    seeds: list[int],
    out_dir: Path,
    method_params: dict[str, dict[str, Any]] | None = None,
    progress: ProgressFactory = None,
    jobs: int = 1,
    reuse: bool = True,
    notify: Callable[[str], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Run every method for every seed into ``out_dir/<method>-seed<k>``; summaries per method.

    Config values a method needs where ``base`` holds fedhet's general default (a validation split, a model
    with maskable units) are applied to ``base`` in place, for every method, with a notice.

    The standalone accuracies used for fairness are computed (or read from the cache) once per seed and
    shared by all methods of that seed. With ``reuse``, finished runs of the same experiment are read
    back instead of rerun and unfinished ones resume from their checkpoint. ``jobs > 1`` runs cells in
    that many worker processes. ``notify`` receives one-line messages for the user (runs reused).
    """
    for m in methods:
        strategy_class(m)  # fail early on unknown names
    if jobs < 1:
        raise ValueError(f"jobs={jobs} must be >= 1")
    method_params = method_params or {}
    strategies, notices = with_method_defaults(base, methods, method_params)
    for notice in notices:
        if notify:
            notify(f"note: {notice}, for every method of the comparison (one split and one model for all)")
    # a comparison that fails before any run wrote there leaves no folder it created (each run's folder
    # goes with its lock: RunDirLock.release)
    created = make_dirs(out_dir)
    try:
        done = _run_cells(
            base, methods, seeds, out_dir, method_params, strategies, progress, jobs, reuse, notify
        )
    except BaseException:
        remove_empty_dirs(created)
        raise
    return {m: [done[(m, s)] for s in seeds] for m in methods}


def _run_cells(
    base: ExperimentConfig,
    methods: list[str],
    seeds: list[int],
    out_dir: Path,
    method_params: dict[str, dict[str, Any]],
    strategies: list[Any],
    progress: ProgressFactory,
    jobs: int,
    reuse: bool,
    notify: Callable[[str], None] | None,
) -> dict[tuple[str, int], dict[str, Any]]:
    """The comparison's cells (:func:`run_comparison`): plan, reuse what is finished, run the rest; the
    summary of every (method, seed)."""
    configs = [method_config(base, m, base.seed, method_params.get(m)) for m in methods]  # with the defaults
    auto = comparison_measures_fairness(strategies, configs)
    plan = []
    for seed in seeds:
        for m in methods:
            cfg = method_config(base, m, seed, method_params.get(m))
            run_dir = out_dir / run_name(m, seed)
            plan.append(PlannedRun(m, seed, cfg, run_dir, _needs_standalone(cfg, auto), may_resume=reuse))
    if reuse:
        conflicts = conflicting_cells(plan)
        if conflicts:
            raise RunDirectoryError(
                f"{len(conflicts)} cell(s) of {out_dir} hold runs of a different experiment, which this "
                "comparison would replace: "
                + "; ".join(conflicts[:5])
                + ("; ..." if len(conflicts) > 5 else "")
                + f". Pass {option('rerun')} to replace them, or choose another {option('out')}"
            )
    done: dict[tuple[str, int], dict[str, Any]] = {}
    if reuse:
        for run in plan:
            summary = finished_summary(run.cfg, run.run_dir)
            if summary is not None:
                log.info("reusing the finished run %s", run.run_dir)
                done[(run.method, run.seed)] = summary
                remember_standalone(run, summary)
    # 'standalone' cells first: each fills the cache that its seed's fairness metrics read.
    todo = sorted(
        (r for r in plan if (r.method, r.seed) not in done), key=lambda r: not r.provides_standalone
    )
    if done and notify:
        names = ", ".join(f"{m} seed {s}" for m, s in done)
        notify(
            f"reusing {len(done)} finished run(s) in {out_dir} ({names}); pass {option('rerun')} to run "
            "them again"
        )
    if notify:
        for run in _standalone_runs(todo).values():
            if any(r.provides_standalone and standalone_key(r.cfg) == standalone_key(run.cfg) for r in todo):
                continue  # the seed's 'standalone' cell is the pre-pass
            if cached_standalone_accuracies(run.cfg) is None:
                notify(prepass_notice(run.cfg, _prepass_reason(run)))
    if todo and jobs == 1:
        _run_sequential(todo, done, progress)
    elif todo:
        _run_parallel(todo, done, progress, jobs)
    return done


def _prepass_reason(run: PlannedRun) -> str:
    strategy = build_strategy(run.cfg.method.name, run.cfg.method.params)
    if "reference_contributions" in strategy.requirements() or run.cfg.eval.fairness is True:
        return reference_reason(run.cfg, strategy)
    return (
        'this comparison measures fairness (eval.fairness = "auto" and one of its methods reports it; set '
        "eval.fairness = false to skip it)"
    )


def _standalone_runs(todo: list[PlannedRun]) -> dict[str, PlannedRun]:
    """One representative run per distinct standalone cache key among the runs that need one."""
    keys: dict[str, PlannedRun] = {}
    for run in todo:
        if run.needs_standalone:
            keys.setdefault(standalone_key(run.cfg), run)
    return keys


def _run_sequential(
    todo: list[PlannedRun], done: dict[tuple[str, int], dict[str, Any]], progress: ProgressFactory
) -> None:
    standalone: dict[str, np.ndarray] = {}
    for run in todo:
        sa = None
        if run.needs_standalone:
            key = standalone_key(run.cfg)
            if key not in standalone:
                cb = progress(run.standalone_label, run.cfg.train.rounds) if progress else None
                standalone[key] = standalone_accuracies(run.cfg, progress=cb)
            sa = standalone[key]
        cb = progress(run.label, run.cfg.train.rounds) if progress else None
        done[(run.method, run.seed)] = summary = execute_run(run, sa, cb)
        remember_standalone(run, summary)


# -- worker processes ---------------------------------------------------------------------------------------
def _worker_progress(events, key: str) -> Callable[..., None] | None:
    if events is None:
        return None

    def send(rnd: int, total: int, line: dict[str, Any]) -> None:
        events.put((key, rnd, total, {k: line[k] for k in _PROGRESS_FIELDS if k in line}))

    return send


def _worker_standalone(cfg: ExperimentConfig, key: str, events) -> None:
    standalone_accuracies(cfg, progress=_worker_progress(events, key))


def _worker_run(run: PlannedRun, events, key: str) -> dict[str, Any]:
    sa = standalone_accuracies(run.cfg) if run.needs_standalone else None  # cached by the first phase
    return execute_run(run, sa, _worker_progress(events, key))


def _die_with_parent(parent_pid: int) -> None:
    """Worker initializer: the kernel sends SIGTERM to this process when the comparison's process dies
    (SIGTERM, SIGKILL or a crash), so no worker outlives it to race a rerun in the same cells (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: workers still end with the pool when the parent exits
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _run_parallel(
    todo: list[PlannedRun],
    done: dict[tuple[str, int], dict[str, Any]],
    progress: ProgressFactory,
    jobs: int,
) -> None:
    ctx = mp.get_context("spawn")  # torch and fork do not mix; spawn starts clean interpreters
    callbacks: dict[str, Callable[..., None]] = {}
    manager = None
    if progress:
        manager = SyncManager(ctx=ctx)
        manager.start(_die_with_parent, (os.getpid(),))
    events = manager.Queue() if manager else None
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set() or (events is not None and not events.empty()):
            try:
                key, rnd, total, line = events.get(timeout=0.2)
            except queue.Empty:
                continue
            if key in callbacks:
                callbacks[key](rnd, total, line)

    listener = threading.Thread(target=pump, daemon=True) if events is not None else None
    if listener:
        listener.start()
    try:
        # A fresh process per cell: it runs the tree's code as the cell starts, all of it (process_pool.py)
        with FreshProcessPool(jobs, ctx, initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
            # Phase 1: the standalone accuracies each needed seed shares (computed once, into the cache), by
            # the seed's 'standalone' cell where the comparison has one.
            cells = {standalone_key(r.cfg): r for r in todo if r.provides_standalone}
            futures = {}
            for key, run in _standalone_runs(todo).items():
                if key in cells:
                    cell = cells[key]
                    if progress:
                        callbacks[cell.label] = progress(cell.label, cell.cfg.train.rounds)
                    futures[pool.submit(_worker_run, cell, events, cell.label)] = cell
                    continue
                if progress:
                    callbacks[run.standalone_label] = progress(run.standalone_label, run.cfg.train.rounds)
                futures[pool.submit(_worker_standalone, run.cfg, run.standalone_label, events)] = None
            for fut in as_completed(futures):
                cell = futures[fut]
                if cell is not None:
                    done[(cell.method, cell.seed)] = summary = fut.result()
                    remember_standalone(cell, summary)
                else:
                    fut.result()
            # Phase 2: every other cell.
            futures = {}
            for run in todo:
                if (run.method, run.seed) in done:
                    continue
                if progress:
                    callbacks[run.label] = progress(run.label, run.cfg.train.rounds)
                futures[pool.submit(_worker_run, run, events, run.label)] = run
            for fut in as_completed(futures):
                run = futures[fut]
                done[(run.method, run.seed)] = fut.result()
    finally:
        stop.set()
        if listener:
            listener.join(timeout=5)
        if manager:
            manager.shutdown()


def default_threads(jobs: int) -> int:
    """Torch threads per worker when ``jobs`` workers share this machine's cores."""
    return max(1, (os.cpu_count() or 1) // jobs)


#: A summary's views and the keys of their mean and std in a compare row.
VIEW_KEYS = {
    "final": ("mean", "std"),
    "best": ("best_mean", "best_std"),
    "last": ("last_mean", "last_std"),
    "last_100": ("last100_mean", "last100_std"),
}


def aggregate_rows(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Mean and std over seeds of every scalar metric, final, best, last-10 rounds and last 100 evaluations,
    one row per method.

    A metric some seed reports with no value (None or non-finite: Pearson of equal rewards) is averaged over
    the seeds that have one; ``defined[view][metric]`` says how many seeds that is (0: none has a value).
    """
    rows = []
    for m, summaries in results.items():
        row: dict[str, Any] = {
            "method": m,
            "seeds": [s["seed"] for s in summaries],
            # seed -> the round its run diverged in (the engine stopped it); its views are those at the stop
            "diverged": {s["seed"]: s["diverged"]["round"] for s in summaries if s.get("diverged")},
        }
        # a metric a seed has no value for is None in its final view and absent from its best/last views
        valueless = {k for s in summaries for k, x in (s.get("final") or {}).items() if x is None}
        row["defined"] = {}
        for view, (mk, sk) in VIEW_KEYS.items():
            row[mk], row[sk], defined = {}, {}, {}
            views = [s.get(view) or {} for s in summaries]  # runs from before a view existed have none
            keys = sorted(valueless | {k for v in views for k, x in v.items() if isinstance(x, int | float)})
            for k in keys:
                vals = [v.get(k) for v in views]
                vals = [float(v) for v in vals if isinstance(v, int | float) and math.isfinite(v)]
                defined[k] = len(vals)
                if vals:
                    row[mk][k] = float(np.mean(vals))
                    row[sk][k] = float(np.std(vals))
            row["defined"][view] = defined
        rows.append(row)
    return rows


def write_rows_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """The compare table as CSV: one line per method, columns ``<view>_<metric>_mean|std`` for every scalar
    metric of the final, best, last-10 and last-100 views (the ``fedhet compare --json`` rows, flattened)."""
    import csv

    columns = ["method", "seeds"]
    for view, (mk, _sk) in VIEW_KEYS.items():
        metrics = sorted({k for row in rows for k in row.get(mk, {})})
        columns += [f"{view}_{k}_{stat}" for k in metrics for stat in ("mean", "std")]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            line: dict[str, Any] = {"method": row["method"], "seeds": " ".join(map(str, row["seeds"]))}
            for view, (mk, sk) in VIEW_KEYS.items():
                for k, v in row.get(mk, {}).items():
                    line[f"{view}_{k}_mean"], line[f"{view}_{k}_std"] = v, row[sk].get(k)
            writer.writerow(line)
    return path
