"""What a study is, and the one loop that runs one.

A study is a measurement behind a docs page that is not a paper's table (those are ``fedhet reproduce``):
the robustness table, the audit's precision and recall, data-free fairness, and the analyses that read a
reproduction's runs to explain its gaps. Each study module defines ``STUDY``; ``fedhet study NAME ACTION``
runs it. A study that makes runs lists them as :class:`CompareCell` s, each run by :func:`fedhet.compare`
into ``OUT/<cell path>``: finished cells are reused, so an interrupted ``run`` resumes where it stopped.
"""

from __future__ import annotations

import json
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
    #: after the cells: a study's own extra runs (e.g. one timed standalone run), given (out, echo)
    after_cells: Callable[[Path, Callable[[str], None]], None] | None = None
    #: more actions, e.g. "calibrate": (paths, options) -> Markdown
    actions: Mapping[str, Callable[[list[Path], Mapping[str, Any]], str]] = field(default_factory=dict)
    options: tuple[Option, ...] = ()
    #: for an analysis (no cells): what it reads, as the user would produce it
    reads: str = ""


def run_study(
    study: Study,
    out: Path,
    seeds: int,
    jobs: int,
    overrides: Mapping[str, Any] | None = None,
    echo: Callable[[str], None] = print,
) -> None:
    """Run every cell of ``study`` into ``out`` (finished cells reused), then its ``after_cells``.

    Seed-major: every cell's seed 0, then every cell's seed 1, and so on, so a study stopped part-way has
    every cell at the seeds it finished (its table says how many). With ``jobs`` > 1, up to ``jobs`` cells
    run at once, each in a fresh process (one thread each, as the comparisons' workers). ``overrides``
    (dotted keys) apply to every cell after the cell's own, e.g. a smaller scale for a trial.
    """
    if study.cells is None:
        raise ValueError(f"study {study.name!r} makes no runs; it reads {study.reads}")
    cells = study.cells()
    extra = dict(overrides or {})
    for upto in range(1, seeds + 1):
        if jobs <= 1:
            for n, cell in enumerate(cells, 1):
                echo(f"[seed {upto - 1}: {n}/{len(cells)}] {cell.path}: {cell.describe()}")
                run_cell(cell, upto, extra, out)
            continue
        import multiprocessing as mp
        import os
        from concurrent.futures import as_completed

        from fedhet.comparison import _die_with_parent
        from fedhet.process_pool import FreshProcessPool

        ctx = mp.get_context("spawn")
        with FreshProcessPool(jobs, ctx, initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
            futures = {pool.submit(run_cell, cell, upto, extra, out): cell for cell in cells}
            for n, fut in enumerate(as_completed(futures), 1):
                cell = futures[fut]
                fut.result()
                echo(f"[seed {upto - 1}: {n}/{len(cells)} done] {cell.path}: {cell.describe()}")
    if study.after_cells is not None:
        study.after_cells(out, echo)


def run_cell(cell: CompareCell, upto: int, overrides: Mapping[str, Any], out: Path) -> str:
    """One cell's seeds 0..upto-1 (finished ones reused) by :func:`fedhet.compare` into ``out/cell.path``."""
    import torch

    from fedhet.api import compare

    torch.set_num_threads(1)  # cells run side by side: one thread each (ENVIRONMENT: threads)
    compare(
        cell.config,
        cell.methods,
        seeds=range(upto),
        overrides={**cell.overrides, **overrides},
        method_params=cell.method_params,
        out=out / cell.path,
        jobs=1,
    )
    return cell.path


# -- reading runs ------------------------------------------------------------------------------------------
def read_lines(run_dir: Path) -> list[dict[str, Any]]:
    """The per-round lines of a run's ``metrics.jsonl``."""
    text = (run_dir / "metrics.jsonl").read_text()
    return [json.loads(s) for s in text.splitlines() if s.strip()]


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def finished_seeds(directory: Path, method: str) -> list[Path]:
    """The finished runs ``<method>-seed<k>`` of a compare directory, in seed order."""
    runs = directory.glob(f"{method}-seed*") if directory.is_dir() else []
    return sorted((p for p in runs if (p / "summary.json").is_file()), key=lambda p: p.name)
