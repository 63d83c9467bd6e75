"""``fedhet study``: the studies behind docs pages that are not a paper's table (:mod:`fedhet.studies`).

    fedhet study                                      # the studies, what each measures, its page
    fedhet study NAME run [--out DIR] [--seeds N] [--jobs N] [--set KEY=VALUE]... [--figure [PNG]]
    fedhet study NAME table [DIR...] [--figure [PNG]] [the study's own options]
    fedhet study NAME ACTION [PATH...]       # a study's own action, e.g. data-free-fairness calibrate

``run`` runs the study's cells (finished ones are reused: an interrupted run resumes) and prints its table;
``table`` prints it from runs already made. The study's own options come after its name.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "study",
        help="run or tabulate a study behind a docs page (robustness, audit-validation, ...)",
        description="Run or tabulate a study behind a docs page; `fedhet study` lists them, "
        "`fedhet study NAME --help` shows one.",
    )
    p.add_argument("name", nargs="?", help="the study (omit to list them)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="ACTION and its arguments")
    p.set_defaults(func=cmd_study)


def study_parser(study: Any) -> argparse.ArgumentParser:
    """The command line of one study: its actions, the shared options and its own."""
    actions = (["run"] if study.cells else []) + ["table", *study.actions]
    p = argparse.ArgumentParser(
        prog=f"fedhet study {study.name}",
        description=f"{study.title} ({study.page}). "
        + (f"Reads {study.reads}." if study.reads else f"Runs {len(study.cells())} compare cells."),
    )
    p.add_argument("action", choices=actions)
    p.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help=f"table: the run directories to read (default {study.default_out}); other actions: their inputs",
    )
    if study.cells:
        p.add_argument("--out", type=Path, default=Path(study.default_out), help="where run writes its cells")
        p.add_argument("--seeds", type=int, default=study.default_seeds, help="run: seeds 0..N-1")
        p.add_argument("--jobs", type=int, default=1, help="run: worker processes (each cell's seeds)")
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="SECTION.KEY=VALUE",
            help="run: override a config key in every cell, e.g. a smaller scale for a trial (repeatable)",
        )
        if study.record is not None:
            p.add_argument(
                "--records",
                type=Path,
                default=Path("docs/results/cells") / study.name,
                help="run: where each finished run is recorded (a seed whose records stand is skipped); "
                "a trial with --set belongs elsewhere, e.g. --records /tmp/records",
            )
    if study.figure is not None:
        p.add_argument(
            "--figure",
            nargs="?",
            const=study.default_figure,
            type=Path,
            help=f"also draw the figure (default path {study.default_figure})",
        )
    for option in study.options:
        p.add_argument(
            f"--{option.name.replace('_', '-')}",
            dest=option.name,
            type=option.type,
            default=option.default,
            nargs=option.nargs,
            help=option.help,
        )
    return p


def cmd_study(args: argparse.Namespace) -> int:
    from fedhet.config import parse_set_args, parse_value
    from fedhet.errors import ConfigError
    from fedhet.studies import STUDIES, get_study, run_study

    if args.name is None:
        for name in STUDIES:
            study = get_study(name)
            print(f"{name}: {study.title}\n    page: {study.page}")
        print(f"\n{len(STUDIES)} studies; `fedhet study NAME --help` shows one")
        return 0
    study = get_study(args.name)
    opts = study_parser(study).parse_args(args.rest)
    options = {o.name: getattr(opts, o.name) for o in study.options}
    if opts.action == "run":
        overrides = {key: parse_value(value) for key, value in parse_set_args(opts.set)}
        records = getattr(opts, "records", None)
        run_study(
            study,
            opts.out,
            opts.seeds,
            opts.jobs,
            overrides,
            echo=lambda s: print(s, flush=True),
            records=records,
        )
        if records is not None:
            options["records"] = records
        dirs = [opts.out]
    else:
        dirs = opts.paths or [Path(study.default_out)]
    if opts.action in study.actions:
        print(study.actions[opts.action](opts.paths, options))
        return 0
    missing = [d for d in dirs if not d.is_dir()]
    if missing:
        hint = f"run `fedhet study {study.name} run` first" if study.cells else f"it reads {study.reads}"
        raise ConfigError(f"{', '.join(map(str, missing))} does not exist; {hint}")
    print(study.table(dirs, options))
    figure = getattr(opts, "figure", None)
    if figure is not None:
        print(f"figure: {study.figure(dirs, figure, options)}")
    return 0
