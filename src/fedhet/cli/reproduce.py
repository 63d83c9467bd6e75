"""``fedhet reproduce``: run a published table (``fedhet.reproduce``) and print our numbers beside the
paper's; optionally write its result page."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fedhet.cli.common import RunProgress, rerun_command, results_console, status_console, writable_dir
from fedhet.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reproduce", help="run a published table and print our numbers beside the paper's")
    p.add_argument("table", nargs="?", help="table name in configs/reproduce/ or a path (omit to list)")
    p.add_argument("--list", action="store_true", help="list the available tables")
    p.add_argument("--seeds", type=int, help="seeds per row (default: the table's)")
    p.add_argument("--rounds", type=int, help="override the rounds of every row (reduced-scale runs)")
    p.add_argument(
        "--scale",
        choices=("quick", "cpu", "full"),
        default="full",
        help="quick: minutes, checks the pipeline; cpu: the largest that fits a 2-core machine in about an "
        "hour per table (says what it cut); full: the papers' settings (default; some tables need a GPU)",
    )
    p.add_argument("--page", metavar="PATH", help="also write a result page (e.g. docs/results/NAME.md)")
    p.add_argument(
        "--keep-page-rows",
        action="store_true",
        help="keep the measured rows already on --page that this run leaves out (--rows), with their "
        "commands, provenance and figures: a table measured a few rows at a time",
    )
    p.add_argument(
        "--page-only",
        action="store_true",
        help="rewrite --page from the rows it holds, with the table's current findings, notes and gaps; runs "
        "nothing (its commands stay those that measured the rows)",
    )
    p.add_argument(
        "--rows",
        action="append",
        help="run only rows whose name contains this text (repeat it for rows matching any of several)",
    )
    p.add_argument(
        "--no-records",
        action="store_true",
        help="with --page: run every cell, even one whose record under the page's cells/ still holds (same "
        "experiment, same results stamp: `fedhet records`)",
    )
    p.add_argument("--jobs", type=int, default=1, help="worker processes (as in `fedhet compare`)")
    p.add_argument("--methods", help="run only these methods (comma-separated)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--out", help="output directory")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_reproduce)


def reproduce_command(args: argparse.Namespace, table: str, scale: str) -> str:
    """The `fedhet reproduce` command line that regenerates a result page (printed on the page)."""
    import shlex

    parts = ["fedhet", "reproduce", table, "--scale", scale]
    optional = {
        "--seeds": args.seeds,
        "--rounds": args.rounds,
        "--methods": args.methods,
        "--out": args.out,  # where its runs are (tables sharing runs name the same folder)
    }
    optional["--jobs"] = args.jobs if args.jobs > 1 else None
    for flag, value in optional.items():
        if value is not None:
            parts += [flag, str(value)]
    for item in args.rows or []:
        parts += ["--rows", item]
    for item in args.set:
        parts += ["--set", item]
    parts += ["--page", args.page] + (["--keep-page-rows"] if args.keep_page_rows else [])
    return shlex.join(parts)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from fedhet.engine.records import jsonable as _jsonable
    from fedhet.report.provenance import machine_line
    from fedhet.reproduce import (
        keep_page_rows,
        list_specs,
        load_spec,
        read_page_rows,
        render_markdown,
        rerender_page,
        rows_without_data,
        run_spec,
        write_page,
        write_results,
    )
    from fedhet.reproduce.cells import fill_from_records, record_dir, write_records, write_table_record

    if args.list or not args.table:
        for name in list_specs():
            spec = load_spec(name)
            offline = len(rows_without_data(spec))
            extra = f"; {offline} row(s) need data not found here (--set data.root=DIR)" if offline else ""
            print(f"{name}: {spec.title} ({len(spec.rows)} rows{extra}; methods {', '.join(spec.methods)})")
        return 0
    console = status_console(args)
    spec = load_spec(args.table)
    scale = spec.at_scale(args.scale)
    kept = None
    if args.page_only and not (args.page and Path(args.page).is_file()):
        raise ConfigError("--page-only rewrites an existing result page; give it with --page PATH")
    if args.keep_page_rows or args.page_only:  # read before running: another table or scale stops here
        if not args.page:
            raise ConfigError("--keep-page-rows keeps the rows of the page named by --page; add --page PATH")
        if Path(args.page).is_file():
            kept = read_page_rows(Path(args.page), spec, scale.name)
    overrides = list(args.set)
    if args.jobs > 1:
        from fedhet.comparison import default_threads

        overrides.append(f"train.threads={default_threads(args.jobs)}")
    if args.rounds is not None:
        overrides.append(f"train.rounds={args.rounds}")
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else None
    # A stable default directory per (table, scale): rerunning the command continues an interrupted run.
    out_dir = writable_dir(
        Path(args.out) if args.out else Path("runs") / "reproduce" / f"{spec.path.stem}-{scale.name}", "--out"
    )
    # printed on Ctrl-C: the same command into the same folder reuses finished cells, resumes the others
    args.resume_command = rerun_command(getattr(args, "argv", []), out_dir)
    if not args.quiet:
        console.print(f"{spec.title}: scale {scale.name} ({scale.note}); output {out_dir}")
    # each finished cell leaves a record beside the page; a cell whose record still holds is not run again
    cells_dir = Path(args.page).parent / "cells" if args.page and not args.no_records else None
    record_run = None
    if args.page and not args.page_only:
        # each run recorded as it finishes: an interrupted table keeps its finished cells, runs or not
        run_command = reproduce_command(args, spec.path.stem, scale.name)

        def record_run(row, base, method: str, seed: int, run_dir: Path) -> None:
            target = record_dir(Path(args.page).parent / "cells", spec, scale.name, row.folder)
            write_table_record(
                spec, target, run_dir, row.name, method, seed, scale=scale.name, command=run_command,
                machine=machine_line(), rounds=base.train.rounds, clients=base.data.clients,
                model=base.model.name,
            )  # fmt: skip

    started = time.perf_counter()
    with RunProgress(console, enabled=not args.quiet) as prog:
        results = run_spec(
            spec,
            seeds=args.seeds,
            overrides=overrides,
            rows=args.rows,
            methods=methods,
            out_dir=out_dir,
            progress=prog.callback,
            jobs=args.jobs,
            scale=scale.name,
            cells_dir=cells_dir,
            measure=not args.page_only,
            record_run=record_run,
        )
    wall = time.perf_counter() - started
    md = write_results(spec, results, out_dir, scale=scale.name)
    if args.page and args.page_only:
        # the page again from what it holds and its records, its provenance as it was: nothing ran
        page = rerender_page(spec, Path(args.page), scale=scale.name)
        if not args.quiet:
            console.print(f"result page written to {page}")
    elif args.page:
        from fedhet.report.provenance import commit

        command = reproduce_command(args, spec.path.stem, scale.name)
        cells_dir = Path(args.page).parent / "cells"
        write_records(spec, results, cells_dir, scale=scale.name, command=command, machine=machine_line())
        page_results = keep_page_rows(spec, results, kept) if kept else results
        fill_from_records(spec, page_results, cells_dir, scale=scale.name)
        page = write_page(
            spec,
            page_results,
            Path(args.page),
            scale=scale.name,
            command=command,
            commit=commit(),
            wall_s=wall,
            kept=kept,
        )
        if not args.quiet:
            console.print(f"result page written to {page}")
    if args.json:
        print(json.dumps(_jsonable({"title": spec.title, "scale": scale.name, "results": results})))
    else:
        from rich.markdown import Markdown

        shown = results_console()
        shown.print(Markdown(render_markdown(spec, results, scale=scale.name)))
        shown.print(f"written to {md}")
    return 0
