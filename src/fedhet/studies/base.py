"""What a study is, and the one loop that runs one.

A study is a measurement behind a docs page that is not a paper's table (those are ``fedhet reproduce``):
the robustness table, the audit's precision and recall, data-free fairness, and the analyses that read a
reproduction's runs to explain its gaps. Each study module defines ``STUDY``; ``fedhet study NAME ACTION``
runs it. A study that makes runs lists them as :class:`CompareCell` s, each run by :func:`fedhet.compare`
into ``OUT/<cell path>``: finished cells are reused, so an interrupted ``run`` resumes where it stopped.

A study that names ``record`` keeps each finished run as a small JSON record beside its page, in the one
record store of the tables (``fedhet.reproduce.store``; ``docs/results/cells/<study>/<cell path>/
<method>-seed<k>.json``: the values its table reads and the store's provenance). Runs are scratch; records
are committed, so a long study fills across sessions: ``run`` skips a seed whose records the store's one rule
lets stand for its runs, and the page is rendered from the records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CompareCell:
    """One ``fedhet compare`` of a study: ``methods`` on the shipped experiment ``config`` into ``path``."""

    path: str
    config: str
    methods: tuple[str, ...]
    overrides: Mapping[str, Any] = field(default_factory=dict)
    method_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def describe(self) -> str:
        sets = " ".join(f"{k}={v}" for k, v in self.overrides.items())
        params = " ".join(f"{m}.{k}={v}" for m, p in self.method_params.items() for k, v in p.items())
        return f"{self.config} {','.join(self.methods)} {sets} {params}".strip()


@dataclass(frozen=True)
class Option:
    """A study-specific command-line option (``--name``) passed to its table / figure / extra actions."""

    name: str
    type: Callable[[str], Any]
    default: Any
    help: str
    nargs: str | None = None


@dataclass(frozen=True)
class Study:
    """A study: what it runs (``cells``), how it tabulates (``table``), optionally a figure and more actions.

    ``table(dirs, options)`` and ``figure(dirs, png, options)`` read the run directories ``dirs`` (the
    study's own ``--out``, or, for an analysis, the runs it explains) and return Markdown / the PNG path.
    """

    name: str
    title: str
    page: str
    default_out: str
    table: Callable[[list[Path], Mapping[str, Any]], str]
    cells: Callable[[], list[CompareCell]] | None = None
    default_seeds: int = 3
    figure: Callable[[list[Path], Path, Mapping[str, Any]], Path] | None = None
    default_figure: str | None = None
    #: after the cells: a study's own extra runs (e.g. one timed standalone run), given (out, echo), and
    #: ``records=`` the records folder where :func:`run_study` keeps records
    after_cells: Callable[..., None] | None = None
    #: more actions, e.g. "calibrate": (paths, options) -> Markdown
    actions: Mapping[str, Callable[[list[Path], Mapping[str, Any]], str]] = field(default_factory=dict)
    options: tuple[Option, ...] = ()
    #: for an analysis (no cells): what it reads, as the user would produce it
    reads: str = ""
    #: (cell, run directory, method) -> the values the table reads from one finished run, kept as its record
    record: Callable[[CompareCell, Path, str], dict[str, Any]] | None = None
    #: before the cells: write what they read that no package holds (e.g. a table's files), idempotent
    before_cells: Callable[[], None] | None = None


def run_study(
    study: Study,
    out: Path,
    seeds: int,
    jobs: int,
    overrides: Mapping[str, Any] | None = None,
    echo: Callable[[str], None] = print,
    records: Path | None = None,
) -> None:
    """Run every cell of ``study`` into ``out`` (finished cells reused), then its ``after_cells``.

    Seed-major: every cell's seed 0, then every cell's seed 1, and so on, so a study stopped part-way has
    every cell at the seeds it finished (its table says how many). With ``jobs`` > 1, up to ``jobs`` cells
    run at once, each in a fresh process (one thread each, as the comparisons' workers). ``overrides``
    (dotted keys) apply to every cell after the cell's own, e.g. a smaller scale for a trial. With
    ``records`` (a folder; the study must name ``record``), a seed whose records hold the same experiment
    and code is skipped, and every run that finishes is recorded there at once.
    """
    if study.cells is None:
        raise ValueError(f"study {study.name!r} makes no runs; it reads {study.reads}")
    if records is not None and study.record is None:
        raise ValueError(f"study {study.name!r} keeps no records")
    if study.before_cells is not None:
        study.before_cells()
    cells = study.cells()
    extra = dict(overrides or {})

    def todo(cell: CompareCell, upto: int) -> list[int]:
        """The seeds below ``upto`` the cell still needs (its run directory reuses the finished ones)."""
        if records is None:
            return list(range(upto))
        return [s for s in range(upto) if not is_recorded(records, cell, s, extra)]

    def finished(cell: CompareCell, seeds: list[int]) -> None:
        if records is not None and study.record is not None:
            write_cell_records(study.record, records, cell, out, seeds, extra)

    for upto in range(1, seeds + 1):
        if jobs <= 1:
            for n, cell in enumerate(cells, 1):
                if not (seeds_todo := todo(cell, upto)):
                    continue
                echo(f"[seed {upto - 1}: {n}/{len(cells)}] {cell.path}: {cell.describe()}")
                run_cell(cell, seeds_todo, extra, out)
                finished(cell, seeds_todo)
            continue
        import multiprocessing as mp
        import os
        from concurrent.futures import as_completed

        from fedhet.comparison import _die_with_parent
        from fedhet.process_pool import FreshProcessPool

        planned = [(cell, seeds_todo) for cell in cells if (seeds_todo := todo(cell, upto))]
        if len(planned) < len(cells):
            echo(f"[seed {upto - 1}] {len(cells) - len(planned)} of {len(cells)} cells recorded already")
        ctx = mp.get_context("spawn")
        with FreshProcessPool(jobs, ctx, initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
            futures = {pool.submit(run_cell, cell, s, extra, out): (cell, s) for cell, s in planned}
            for n, fut in enumerate(as_completed(futures), 1):
                cell, seeds_done = futures[fut]
                fut.result()
                finished(cell, seeds_done)
                echo(f"[seed {upto - 1}: {n}/{len(planned)} done] {cell.path}: {cell.describe()}")
    if study.after_cells is not None:
        study.after_cells(out, echo, **({"records": records} if records is not None else {}))


def run_cell(cell: CompareCell, seeds: list[int], overrides: Mapping[str, Any], out: Path) -> str:
    """One cell's ``seeds`` (finished ones reused) by :func:`fedhet.compare` into ``out/cell.path``."""
    import torch

    from fedhet.api import compare

    torch.set_num_threads(1)  # cells run side by side: one thread each (ENVIRONMENT: threads)
    compare(
        cell.config,
        cell.methods,
        seeds=seeds,
        overrides={**cell.overrides, **overrides},
        method_params=cell.method_params,
        out=out / cell.path,
        jobs=1,
    )
    return cell.path


# -- records -----------------------------------------------------------------------------------------------
_SHARED_CONFIGS: dict[tuple[str, str], Any] = {}


def cell_fingerprints(cell: CompareCell, seed: int, overrides: Mapping[str, Any]) -> dict[str, str]:
    """method -> the experiment fingerprint of the cell's run of it at ``seed``, as :func:`run_cell` runs it
    (:func:`fedhet.comparison.comparison_configs`; the cell's config with the method defaults, cached)."""
    from fedhet.api import as_config
    from fedhet.comparison import method_config, with_method_defaults

    params = {m: dict(p) for m, p in cell.method_params.items()}
    key = (cell.describe(), repr(sorted(overrides.items())))
    if key not in _SHARED_CONFIGS:
        shared = as_config(cell.config, {**cell.overrides, **overrides})
        with_method_defaults(shared, list(cell.methods), params)
        _SHARED_CONFIGS[key] = shared
    shared = _SHARED_CONFIGS[key]
    return {m: method_config(shared, m, seed, params.get(m)).run_fingerprint() for m in cell.methods}


def record_path(records: Path, cell: CompareCell, method: str, seed: int) -> Path:
    from fedhet.reproduce import store

    return store.record_path(records / cell.path, method, seed)


def is_recorded(records: Path, cell: CompareCell, seed: int, overrides: Mapping[str, Any]) -> bool:
    """Whether every method of the cell has a record at ``seed`` that the store's one rule lets stand for its
    run (the same experiment, computed under the results stamp of the code at hand)."""
    from fedhet.reproduce.store import is_reusable, read_record

    prints = cell_fingerprints(cell, seed, overrides)
    return all(
        is_reusable(read_record(record_path(records, cell, method, seed)), prints[method], method)
        for method in cell.methods
    )


def write_cell_records(
    values: Callable[[CompareCell, Path, str], dict[str, Any]],
    records: Path,
    cell: CompareCell,
    out: Path,
    seeds: list[int],
    overrides: Mapping[str, Any] | None = None,
) -> list[Path]:
    """A record of each finished run of ``cell`` at ``seeds`` in ``out`` (see the module docstring); a run
    whose config is not the cell's (another scale, an older definition) is not recorded."""
    from fedhet.config import load_run_config
    from fedhet.engine.rundir import CONFIG_FILE, SUMMARY_FILE, run_name
    from fedhet.report.provenance import machine_line
    from fedhet.reproduce.store import provenance, write_record

    written = []
    for seed in seeds:
        prints = cell_fingerprints(cell, seed, overrides or {})
        for method in cell.methods:
            run = out / cell.path / run_name(method, seed)
            if not ((run / SUMMARY_FILE).is_file() and (run / CONFIG_FILE).is_file()):
                continue
            if load_run_config(run / CONFIG_FILE).run_fingerprint() != prints[method]:
                continue
            record = {
                "cell": cell.path,
                "method": method,
                "seed": seed,
                "values": values(cell, run, method),
                **provenance(read_summary(run), experiment=prints[method], machine=machine_line()),
            }
            written.append(write_record(record_path(records, cell, method, seed), record, compact=True))
    return written


def recorded_runs(
    records: Path, cell: CompareCell, method: str, overrides: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The records of ``cell``'s runs of ``method`` that hold the cell's experiment as it is defined now (from
    any code: a page says which commits computed them), in seed order."""
    from fedhet.reproduce import store

    found = []
    folder = records / cell.path
    for path in sorted(folder.glob(f"{method}-seed*.json")) if folder.is_dir() else []:
        record = store.read_record(path)
        if not record:
            continue
        if record.get("experiment") == cell_fingerprints(cell, record["seed"], overrides or {})[method]:
            found.append(record)
    return sorted(found, key=lambda r: r["seed"])


# -- reading runs ------------------------------------------------------------------------------------------
def read_lines(run_dir: Path) -> list[dict[str, Any]]:
    """The per-round lines of a run's ``metrics.jsonl`` (:func:`fedhet.engine.rundir.read_metrics`)."""
    from fedhet.engine.rundir import read_metrics

    return read_metrics(run_dir)


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A run's summary (:func:`fedhet.engine.rundir.read_summary`)."""
    from fedhet.engine import rundir

    return rundir.read_summary(run_dir)


@dataclass(frozen=True)
class RunLog:
    """A finished run's ``summary.json`` and ``metrics.jsonl`` lines, read once for every value taken."""

    summary: dict[str, Any]
    lines: list[dict[str, Any]]

    @classmethod
    def read(cls, run_dir: Path) -> RunLog:
        return cls(read_summary(run_dir), read_lines(run_dir))

    @property
    def accuracies(self) -> list[float]:
        """Every evaluation's accuracy, in round order."""
        return [line["accuracy"] for line in self.lines if "accuracy" in line]


def finished_seeds(directory: Path, method: str) -> list[Path]:
    """The finished runs ``<method>-seed<k>`` of a compare directory, in seed order
    (:func:`fedhet.engine.rundir.finished_runs`)."""
    from fedhet.engine.rundir import finished_runs

    return finished_runs(directory, method)


def provenance_lines(study: str, seeds: int, records: Path) -> list[str]:
    """The lines a study's page opens its provenance with: the two commands that regenerate every number on it
    (``--seeds`` as the page was run) and the commits its records in ``records`` were computed at."""
    from fedhet.reproduce.store import read_record

    commits = sorted(
        {c for p in records.rglob("*.json") if (r := read_record(p)) for c in r.get("commits") or [] if c}
    )
    return [
        "Regenerate every number on this page with:",
        "",
        "```",
        f"fedhet study {study} run --seeds {seeds}",
        f"fedhet study {study} page",
        "```",
        "",
        f"Computed at commit{'s' if len(commits) != 1 else ''} {', '.join(commits) or 'none'} "
        f"(from the records in `{records}`).",
    ]
