"""The Python API: ``fedhet.run`` and ``fedhet.compare``, the same experiments as the CLI, as objects.

    import fedhet
    result = fedhet.run("celm/fmnist-maverick", overrides={"train.rounds": 5})
    print(result.accuracy, result.contributions)
    table = fedhet.compare("celm/fmnist-maverick", methods=["fedavg", "celm"], seeds=[0, 1])
    print(table.rows)

A config is a path to a TOML file, a shipped experiment's name (``fedhet experiments``), an
:class:`~fedhet.config.ExperimentConfig`, a nested dict as in a TOML file, or None (fedhet's defaults).
Results carry what ``fedhet run --json`` and ``fedhet compare --json`` print, plus the per-round lines of
``metrics.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet.config import ExperimentConfig, apply_overrides, from_dict, load_config, load_run_config
from fedhet.engine.rundir import CONFIG_FILE, FLOWER_NODES_FILE, read_metrics
from fedhet.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from fedhet.engine.protocol import Strategy

log = logging.getLogger("fedhet")

ConfigLike = str | os.PathLike | ExperimentConfig | Mapping[str, Any] | None
#: progress_bars(description, total_rounds) -> the per-round callback(round, total_rounds, line) of one bar
ProgressBars = Callable[[str, int], Callable[[int, int, dict[str, Any]], None]]


@dataclass
class RunResult:
    """One run: the summary (as ``fedhet run --json``), its per-round metrics and where it was written."""

    method: str
    seed: int
    rounds: int
    #: Final / best evaluation values: accuracy, balanced_accuracy, per-class recall, ...
    final: dict[str, Any]
    best: dict[str, Any]
    #: Per-client contribution estimates (CELM, CGSV, ShapFed, ...) or None.
    contributions: list[float] | None
    #: Per-client reward accuracies (methods with reward models) or None.
    rewards: list[float] | None
    wall_time_s: float
    run_dir: Path | None
    #: One dict per round, the lines of metrics.jsonl.
    metrics: list[dict[str, Any]] = field(repr=False)
    #: The whole summary dict (summary.json).
    summary: dict[str, Any] = field(repr=False)

    @property
    def accuracy(self) -> float:
        """Final test accuracy of the global model (of the mean reward model where there is none)."""
        return float(self.final["accuracy"])

    @classmethod
    def from_summary(
        cls, summary: Mapping[str, Any], metrics: list[dict[str, Any]] | None = None
    ) -> RunResult:
        run_dir = Path(summary["run_dir"]) if summary.get("run_dir") else None
        if metrics is None:
            metrics = read_metrics(run_dir, missing_ok=True) if run_dir is not None else []
        return cls(
            method=summary["method"],
            seed=int(summary["seed"]),
            rounds=int(summary["rounds"]),
            final=dict(summary.get("final") or {}),
            best=dict(summary.get("best") or {}),
            contributions=summary.get("contributions"),
            rewards=summary.get("rewards"),
            wall_time_s=float(summary.get("wall_time_s") or 0.0),
            run_dir=run_dir,
            metrics=metrics,
            summary=dict(summary),
        )


@dataclass
class CompareResult:
    """A comparison: mean ± std rows (as ``fedhet compare --json``) and every run, by method."""

    rows: list[dict[str, Any]]
    runs: dict[str, list[RunResult]]
    #: Where the runs, ``compare.json`` and ``compare.csv`` are: ``out``, or the temporary folder
    #: (``$TMPDIR/fedhet-compare-*``) made when none was given, which fedhet never deletes.
    out_dir: Path
    #: The configuration every method started from, with the method defaults applied (as compare.json).
    config: ExperimentConfig | None = field(default=None, repr=False)

    def to_csv(self, path: str | os.PathLike) -> Path:
        """Write :attr:`rows` as CSV (what ``fedhet compare`` writes to ``compare.csv``)."""
        from fedhet.comparison import write_rows_csv

        return write_rows_csv(self.rows, Path(path))

    def row(self, method: str) -> dict[str, Any]:
        """The aggregated row of ``method``."""
        for row in self.rows:
            if row["method"] == method:
                return row
        raise KeyError(f"no method {method!r} in this comparison; it holds {list(self.runs)}")


def as_config(config: ConfigLike, overrides: Mapping[str, Any] | None = None) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from any accepted form (a copy: the caller's object is not changed), with
    ``overrides`` (dotted keys, e.g. ``{"train.rounds": 5}``) applied and validated."""
    if config is None:
        cfg = ExperimentConfig()
    elif isinstance(config, ExperimentConfig):
        cfg = config.copy()
    elif isinstance(config, Mapping):
        cfg = from_dict(dict(config))
    elif isinstance(config, str | os.PathLike):
        cfg = load_config(config)
    else:
        raise ConfigError(
            f"config must be a path, an experiment name, an ExperimentConfig or a dict, not "
            f"{type(config).__name__}"
        )
    # strings are taken as given (a TOML literal would turn "1e-3" into a float, "true" into a bool)
    given = [(k, json.dumps(v) if isinstance(v, str) else v) for k, v in (overrides or {}).items()]
    if given:
        apply_overrides(cfg, given)
    return cfg


def _use_dataset(cfg: ExperimentConfig, dataset: Any) -> None:
    if dataset is None:
        return
    from fedhet.data.datasets import Dataset, register_dataset

    if not isinstance(dataset, Dataset):
        raise ConfigError(
            f"dataset must be a fedhet Dataset (fedhet.data.from_arrays), not {type(dataset).__name__}"
        )
    register_dataset(dataset, overwrite=True)
    cfg.data.dataset = dataset.name


#: The engines :func:`run` drives.
ENGINES = ("embedded", "flower-simulation")


def run(
    config: ConfigLike = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    resume: bool = False,
    dataset: Any = None,
    progress: Callable[[int, dict[str, Any]], None] | None = None,
    engine: str = "embedded",
    progress_bars: ProgressBars | None = None,
    notify: Callable[[str], None] | None = None,
) -> RunResult:
    """Run one experiment and return its result (what ``fedhet run`` does).

    ``out``: the run directory (written as by ``fedhet run``: config, metrics.jsonl, summary, checkpoints);
    None writes no run directory. Outside ``out`` a run writes only to fedhet's cache, ``$FEDHET_CACHE``
    (default ``~/.cache/fedhet``, safe to delete): ``datasets/`` when it decodes image folders or tars
    (CIFAR-10's JPEG copy, CINIC-10, Tiny-ImageNet), and ``standalone/<key>.json`` when it runs the standalone
    pre-pass — only for a method that takes the clients' standalone accuracies as an input or when fairness is
    measured (``eval.fairness = true``, or ``"auto"`` for CGSV, CFFL, IAFL, ShapFed, FedRAC, FedSAC; announced
    through ``notify``). ``resume``: continue the interrupted run in ``out`` from its last checkpoint; its
    config is the run's own (``config`` None reads ``out/config.toml``) and method defaults are not applied
    again. ``dataset``: a :class:`fedhet.data.Dataset` to train on (registered under its name).
    ``progress(round, line)`` is called after every round. ``engine``: ``"embedded"`` (one process) or
    ``"flower-simulation"`` (Flower's simulation engine, Ray; needs fedhet[flower]). ``progress_bars`` opens
    one progress display per simulation (the standalone pre-pass where the run needs it, then the run). Method
    defaults (a validation split for CFFL/FedRAC, their model) are applied as in the CLI, each with a notice
    passed to ``notify`` (default: logged).
    """
    from fedhet.algorithms import build_strategy
    from fedhet.engine.rundir import check_run_dir
    from fedhet.experiment import apply_method_defaults, make_simulation

    if engine not in ENGINES:
        raise ConfigError(f"engine {engine!r} is not one of {list(ENGINES)}")
    if resume and out is None:
        raise ConfigError("resume continues the run directory given as out; pass out=RUN_DIR")
    if resume and overrides:
        raise ConfigError(
            f"resume continues the run exactly as its {CONFIG_FILE} says; overrides would change it"
        )
    if resume and (Path(out) / FLOWER_NODES_FILE).is_file():  # never rerun a Flower run here, nodes gone
        folder = Path(out).resolve()
        raise ConfigError(
            f"{out} holds a Flower run ({FLOWER_NODES_FILE}): resume it on Flower, with resume=true in flwr "
            f"run's --run-config: flwr run APP FEDERATION --run-config \"config='CONFIG' run-dir='{folder}' "
            'resume=true" (from Python: fedhet.flower.server.make_server_app(..., resume=True))'
        )
    if resume and engine != "embedded":
        raise ConfigError("resume works with the embedded engine only (Flower nodes keep their own state)")
    if resume and config is None:
        config = Path(out) / CONFIG_FILE
    notify = notify or _log_notice
    # a resumed run reads its own config.toml as it ran (a default changed since keeps its old value there)
    cfg = load_run_config(config) if resume else as_config(config, overrides)
    _use_dataset(cfg, dataset)
    strategy = build_strategy(cfg.method.name, cfg.method.params)  # a bad method fails before any work
    if not resume:  # a resumed run's config.toml holds them already (and any value the user chose instead)
        for notice in apply_method_defaults(cfg, [strategy]):
            notify(f"note: {notice}")
    run_dir = Path(out) if out is not None else None
    if run_dir is not None:
        check_run_dir(run_dir, resume=resume, overwrite=overwrite)
    if engine == "flower-simulation":
        from fedhet.engine.boundary import check_transport
        from fedhet.flower import require_flower

        require_flower()
        check_transport(strategy, "flower")
    reference = _standalone_reference(cfg, strategy, notify, progress_bars)
    per_round = _per_round(
        _bar(progress_bars, f"{cfg.method.name} seed {cfg.seed}", cfg.train.rounds), progress
    )
    either_engine = dict(strategy=strategy, reference_contributions=reference, progress=per_round)
    if engine == "flower-simulation":
        from fedhet.flower.server import run_flower_simulation

        summary = run_flower_simulation(cfg, run_dir, overwrite=overwrite, **either_engine)
        return RunResult.from_summary(summary)
    sim = make_simulation(cfg, run_dir=run_dir, resume=resume, overwrite=overwrite, **either_engine)
    summary = sim.run()
    return RunResult.from_summary(summary, metrics=[dict(line) for line in sim.history])


def _log_notice(message: str) -> None:
    log.warning("%s", message)


def _standalone_reference(
    cfg: ExperimentConfig,
    strategy: Strategy,
    notify: Callable[[str], None],
    progress_bars: ProgressBars | None,
) -> np.ndarray | None:
    """The clients' standalone accuracies where the run needs them (else None): from the cache, or from the
    standalone pre-pass, announced through ``notify`` and shown with its own progress bar."""
    from fedhet.experiment import (
        cached_standalone_accuracies,
        needs_reference,
        prepass_notice,
        reference_reason,
        standalone_accuracies,
    )

    if not needs_reference(cfg, strategy):
        return None
    reference = cached_standalone_accuracies(cfg)
    if reference is None:
        notify(f"note: {prepass_notice(cfg, reference_reason(cfg, strategy))}")
        bar = _bar(
            progress_bars, f"standalone pre-pass seed {cfg.seed} (fairness reference)", cfg.train.rounds
        )
        reference = standalone_accuracies(cfg, progress=bar)
    return reference


def _bar(progress_bars: ProgressBars | None, description: str, total: int) -> Callable[..., None] | None:
    return None if progress_bars is None else progress_bars(description, total)


def _per_round(
    bar: Callable[[int, int, dict[str, Any]], None] | None,
    progress: Callable[[int, dict[str, Any]], None] | None,
) -> Callable[[int, int, dict[str, Any]], None] | None:
    """The engine's per-round callback: the progress bar's, then the caller's ``progress(round, line)``."""
    if progress is None:
        return bar

    def per_round(rnd: int, total: int, line: dict[str, Any]) -> None:
        if bar is not None:
            bar(rnd, total, line)
        progress(rnd, line)

    return per_round


def compare(
    config: ConfigLike = None,
    methods: Sequence[str] = ("fedavg",),
    *,
    seeds: Sequence[int] = (0,),
    overrides: Mapping[str, Any] | None = None,
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
    out: str | os.PathLike | None = None,
    jobs: int = 1,
    rerun: bool = False,
    dataset: Any = None,
    progress_bars: ProgressBars | None = None,
    notify: Callable[[str], None] | None = None,
) -> CompareResult:
    """Run ``methods`` on the same splits for every seed, as ``fedhet compare`` does, and aggregate.

    ``out`` defaults to a new temporary directory, ``$TMPDIR/fedhet-compare-XXXX`` (named in a message to
    ``notify`` and in the result's ``out_dir``; the runs stay there until you delete it); the rows are written
    there as ``compare.json`` (with the config) and ``compare.csv``. Finished cells in ``out`` are reused
    unless ``rerun``. With ``jobs > 1`` cells run in worker processes, which see a method, model or data set
    registered in Python only if the registration happens when the calling script is imported (or through an
    entry point). ``progress_bars`` opens one progress display per run; ``notify`` receives one-line messages
    for the user (method defaults applied, runs reused; default: logged).
    """
    from fedhet.comparison import aggregate_rows, default_threads, run_comparison, write_rows_csv
    from fedhet.engine.records import jsonable

    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    if not methods:
        raise ConfigError("compare needs at least one method, e.g. methods=['fedavg', 'celm']")
    base = as_config(config, overrides)
    _use_dataset(base, dataset)
    if jobs > 1 and base.train.threads is None:
        base.train.threads = default_threads(jobs)
    notify = notify or _log_notice
    if out is None:
        out_dir = Path(tempfile.mkdtemp(prefix="fedhet-compare-"))
        notify(
            f"note: no out= given: the runs are written to {out_dir} (result.out_dir; kept until you delete "
            "it; pass out=DIR to choose, and to reuse finished runs on a second call)"
        )
    else:
        out_dir = Path(out)
    results = run_comparison(
        base,
        list(methods),
        [int(s) for s in seeds],
        out_dir,
        {m: dict(p) for m, p in (method_params or {}).items()},
        progress=progress_bars,
        jobs=jobs,
        reuse=not rerun,
        notify=notify,
    )
    rows = aggregate_rows(results)
    payload = {"rows": rows, "out_dir": str(out_dir), "config": base.to_dict()}
    (out_dir / "compare.json").write_text(json.dumps(jsonable(payload), indent=2))
    write_rows_csv(rows, out_dir / "compare.csv")
    runs = {m: [RunResult.from_summary(s) for s in summaries] for m, summaries in results.items()}
    return CompareResult(rows=rows, runs=runs, out_dir=out_dir, config=base)
