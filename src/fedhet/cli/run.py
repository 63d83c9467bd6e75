"""``fedhet run``: one experiment, through :func:`fedhet.api.run`, with a progress bar and a summary table."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from fedhet.cli.common import (
    SHORTCUTS,
    RunProgress,
    add_experiment_args,
    build_config,
    fmt_metric,
    in_percent,
    results_console,
    status_console,
    writable_dir,
)
from fedhet.cli.describe import short_description
from fedhet.engine.names import RunNames
from fedhet.engine.rundir import CONFIG_FILE
from fedhet.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one experiment")
    add_experiment_args(p)
    p.add_argument("--out", help="run directory (default runs/<method>-<dataset>-<split>-s<seed>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what --out holds (a finished or unfinished run, or other files); without it such a "
        "directory is refused",
    )
    p.add_argument(
        "--engine",
        choices=["embedded", "flower-simulation"],
        default="embedded",
        help="embedded (one process, the default) or flower-simulation (Flower's simulation engine, Ray; "
        "needs fedhet[flower]); for a deployment see docs/flower.md",
    )
    p.set_defaults(func=cmd_run)


def default_run_dir(cfg: Any, prefix: str = "") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.out) if cfg.out else Path("runs")
    name = cfg.name or f"{prefix}{cfg.method.name}-{cfg.data.dataset}-{cfg.data.split}-s{cfg.seed}-{stamp}"
    return base / name


def cmd_run(args: argparse.Namespace) -> int:
    from fedhet.api import run

    console = status_console(args)
    config: Any
    if args.resume:
        given = [f"--{a.replace('_', '-')}" for a in (*SHORTCUTS, "out") if getattr(args, a, None)]
        given = (["CONFIG"] if args.config else []) + given + [f"--set {x}" for x in args.set]
        if args.overwrite:
            given.append("--overwrite")
        if given:
            raise ConfigError(
                f"--resume {args.resume} continues the run exactly as its {CONFIG_FILE} says; "
                f"{', '.join(given)} would change it. Drop them, or start a new run (a new --out)"
            )
        run_dir = Path(args.resume)
        config = run_dir / CONFIG_FILE
        if not config.is_file():
            raise SystemExit(f"--resume {run_dir}: no {CONFIG_FILE} there; pass a run directory fedhet wrote")
        if args.engine == "flower-simulation":
            raise SystemExit(
                "--resume works with the embedded engine only (Flower nodes keep their own state)"
            )
    else:
        config = build_config(args)
        run_dir = writable_dir(Path(args.out) if args.out else default_run_dir(config), "--out")
        if not args.quiet:  # a table's rows per site, columns and classes, before any training
            for line in short_description(config):
                print(f"fedhet: {line}", file=sys.stderr)
    args.resume_command = f"fedhet run --resume {shlex.quote(str(run_dir))}"  # printed on Ctrl-C
    # The bar appears with the first round: a bad method or a taken --out fails before it, with no run
    # directory written.
    from fedhet.flower import flower_quiet  # the standard library only; Flower is imported by the run

    # --quiet quiets Flower and Ray too (their INFO lines); their warnings and errors still show
    quiet_flower = flower_quiet(args.quiet and args.engine == "flower-simulation")
    with quiet_flower, RunProgress(console, enabled=not args.quiet, lazy=True) as prog:
        result = run(
            config,
            out=run_dir,
            overwrite=args.overwrite,
            resume=bool(args.resume),
            engine=args.engine,
            progress_bars=prog.callback,
            # shown with --quiet and --json too
            notify=lambda message: print(f"fedhet: {message}", file=sys.stderr),
        )
    if args.json:
        from fedhet.engine.records import jsonable as _jsonable

        print(json.dumps(_jsonable(public_summary(result.summary))))
    else:
        print_summary(results_console(), result.summary)
    return 0


def public_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """What ``fedhet run --json`` prints of a run's summary."""
    keys = (
        "method",
        "run_dir",
        "rounds",
        "seed",
        "final",
        "best",
        "last",
        "contributions",
        "rewards",
        "standalone",
        "wall_time_s",
        "client_names",
        "class_names",
    )
    return {k: summary.get(k) for k in keys}


def print_summary(console, summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{summary['method']} · {summary['rounds']} rounds · seed {summary['seed']}")
    table.add_column("metric")
    table.add_column("final", justify="right")
    table.add_column("best", justify="right")
    for k, v in summary["final"].items():
        if isinstance(v, list):
            continue
        label = f"{k} %" if in_percent(k) else k  # the row's unit
        table.add_row(label, fmt_metric(k, v), fmt_metric(k, summary["best"].get(k)))
    console.print(table)
    names = RunNames.of_summary(summary)
    recall = summary["final"].get("per_class_recall")
    if recall:
        cells = (f"{names.class_name(k)} {fmt_metric('per_class_recall', v)}" for k, v in enumerate(recall))
        console.print("per-class recall %: " + ", ".join(cells), markup=False)
    if summary.get("contributions") is not None:
        cells = (f"{names.client(i)} {c:.3f}" for i, c in enumerate(summary["contributions"]))
        console.print("contributions: " + ", ".join(cells), markup=False)
    if summary.get("rewards") is not None:
        cells = (f"{names.client(i)} {fmt_metric('accuracy', a)}" for i, a in enumerate(summary["rewards"]))
        console.print("reward-model accuracy %: " + ", ".join(cells), markup=False)
    console.print(f"run directory: {summary['run_dir']}  ({summary['wall_time_s']:.1f} s)")
