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
from typing import Any

from fedhet.config import ExperimentConfig, apply_override, from_dict, load_config
from fedhet.errors import ConfigError

log = logging.getLogger("fedhet")

ConfigLike = str | os.PathLike | ExperimentConfig | Mapping[str, Any] | None


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
            metrics = _read_metrics(run_dir) if run_dir is not None else []
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
    out_dir: Path

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


def _read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    for dotted, value in (overrides or {}).items():
        # strings are taken as given (a TOML literal would turn "1e-3" into a float, "true" into a bool)
        apply_override(cfg, dotted, json.dumps(value) if isinstance(value, str) else value)
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


def run(
    config: ConfigLike = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    dataset: Any = None,
    progress: Callable[[int, dict[str, Any]], None] | None = None,
) -> RunResult:
    """Run one experiment in the embedded engine and return its result.

    ``out``: the run directory (written as by ``fedhet run``: config, metrics.jsonl, summary, checkpoints);
    None keeps nothing on disk. ``dataset``: a :class:`fedhet.data.Dataset` to train on (registered under
    its name). ``progress(round, line)`` is called after every round. Method defaults (a validation split
    for CFFL/FedRAC, their model) are applied as in the CLI, with a logged notice.
    """
    from fedhet.algorithms import build_strategy
    from fedhet.engine.rundir import check_run_dir
    from fedhet.experiment import apply_method_defaults, make_simulation

    cfg = as_config(config, overrides)
    _use_dataset(cfg, dataset)
    strategy = build_strategy(cfg.method.name, cfg.method.params)
    for notice in apply_method_defaults(cfg, [strategy]):
        log.warning("note: %s", notice)
    run_dir = Path(out) if out is not None else None
    if run_dir is not None:
        check_run_dir(run_dir, resume=False, overwrite=overwrite)
    per_round = None if progress is None else (lambda rnd, _total, line: progress(rnd, line))
    sim = make_simulation(cfg, run_dir=run_dir, strategy=strategy, overwrite=overwrite, progress=per_round)
    summary = sim.run()
    return RunResult.from_summary(summary, metrics=[dict(line) for line in sim.history])


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
) -> CompareResult:
    """Run ``methods`` on the same splits for every seed, as ``fedhet compare`` does, and aggregate.

    ``out`` defaults to a new temporary directory (the runs stay there). Finished cells in ``out`` are
    reused unless ``rerun``. With ``jobs > 1`` cells run in worker processes, which see a method, model or
    data set registered in Python only if the registration happens when the calling script is imported
    (or through an entry point).
    """
    from fedhet.comparison import aggregate_rows, default_threads, run_comparison

    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    if not methods:
        raise ConfigError("compare needs at least one method, e.g. methods=['fedavg', 'celm']")
    base = as_config(config, overrides)
    _use_dataset(base, dataset)
    if jobs > 1 and base.train.threads is None:
        base.train.threads = default_threads(jobs)
    out_dir = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="fedhet-compare-"))
    results = run_comparison(
        base,
        list(methods),
        [int(s) for s in seeds],
        out_dir,
        {m: dict(p) for m, p in (method_params or {}).items()},
        jobs=jobs,
        reuse=not rerun,
        notify=lambda message: log.warning("%s", message),
    )
    runs = {m: [RunResult.from_summary(s) for s in summaries] for m, summaries in results.items()}
    return CompareResult(rows=aggregate_rows(results), runs=runs, out_dir=out_dir)
