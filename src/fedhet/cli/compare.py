"""``fedhet compare``: several methods on the same splits and seeds, through :func:`fedhet.api.compare`;
the mean ± std table and the contribution table it prints."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from fedhet.cli.common import (
    RunProgress,
    add_experiment_args,
    build_config,
    fmt_metric,
    rerun_command,
    results_console,
    status_console,
    writable_dir,
)
from fedhet.cli.describe import short_description
from fedhet.engine.names import RunNames
from fedhet.errors import ConfigError

#: (metric, final|best, column label) of the compare table, in the papers' layout.
TABLE_METRICS = (
    ("accuracy", "final", "acc %"),
    ("accuracy", "best", "best acc %"),
    ("accuracy", "last", "last-10 acc %"),
    ("balanced_accuracy", "final", "bal. acc %"),
    ("rare_class_recall", "final", "rare recall %"),
    ("fairness_pearson", "final", "fairness"),
    ("fairness_pearson", "best", "best fairness"),
    ("bcf_rate", "final", "BCF rate"),
    ("bcf_rate_code", "final", "BCF (code)"),
    ("contribution_fairness_pearson", "final", "contrib. ρ"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="run several methods on the same splits and seeds; print mean ± std")
    add_experiment_args(p, with_method=False)
    p.add_argument("--methods", required=True, help="comma-separated method names")
    p.add_argument(
        "--method-param",
        action="append",
        default=[],
        metavar="METHOD.KEY=VALUE",
        help="a parameter for one method only, e.g. celm.warmup_fraction=0.1",
    )
    p.add_argument("--seeds", type=int, default=1, help="number of seeds (seed, seed+1, ...)")
    p.add_argument("--seed-list", help="explicit comma-separated seeds")
    p.add_argument("--out", help="output directory")
    p.add_argument("--title", help="report title")
    p.add_argument("--no-report", action="store_true", help="skip the Markdown report")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="worker processes running (method, seed) cells at once (default 1); each gets "
        "cores/jobs torch threads unless train.threads is set",
    )
    p.add_argument(
        "--rerun",
        action="store_true",
        help="rerun finished runs found in --out (default: reuse them, and resume unfinished ones "
        "from their last checkpoint)",
    )
    p.set_defaults(func=cmd_compare)


def parse_method_params(items: list[str], methods: list[str]) -> dict[str, dict[str, Any]]:
    from fedhet.config import parse_value

    out: dict[str, dict[str, Any]] = {m: {} for m in methods}
    for item in items:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise SystemExit(
                f"--method-param {item!r} must look like METHOD.KEY=VALUE, e.g. celm.warmup_fraction=0.1"
            )
        k, v = item.split("=", 1)
        m, key = k.split(".", 1)
        if m not in out:
            raise SystemExit(f"--method-param {item!r}: {m!r} is not among the methods {methods}")
        out[m][key] = parse_value(v)
    return out


def parse_seeds(args: argparse.Namespace, base_seed: int) -> list[int]:
    if args.seed_list is not None:
        items = [s.strip() for s in args.seed_list.split(",")]
        if not all(s.isdigit() for s in items):
            raise ConfigError(
                f"--seed-list {args.seed_list!r} must be comma-separated non-negative integers, e.g. 0,1,2"
            )
        return [int(s) for s in items]
    if args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds}: give a number of seeds >= 1")
    return [base_seed + i for i in range(args.seeds)]


def cmd_compare(args: argparse.Namespace) -> int:
    from fedhet.api import compare
    from fedhet.engine.records import jsonable as _jsonable

    console = status_console(args)
    base = build_config(args, skip=("method",))
    if args.jobs < 1:
        raise SystemExit(f"--jobs {args.jobs}: give a number of worker processes >= 1")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise SystemExit("--methods needs at least one method, e.g. --methods fedavg,standalone")
    method_params = parse_method_params(args.method_param, methods)
    seeds = parse_seeds(args, base.seed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    default = Path(base.out or "runs") / f"compare-{base.data.dataset}-{base.data.split}-{stamp}"
    out_dir = writable_dir(Path(args.out) if args.out else default, "--out")
    if not args.quiet:  # a table's rows per site, columns and classes: once, before any method trains
        for line in short_description(base):
            print(f"fedhet: {line}", file=sys.stderr)
    # printed on Ctrl-C: the same command into the same folder reuses finished cells, resumes the others
    args.resume_command = rerun_command(getattr(args, "argv", []), out_dir, drop=("--rerun",))
    with RunProgress(console, enabled=not args.quiet) as prog:
        # runs every cell, then writes compare.json and compare.csv into out_dir
        result = compare(
            base,
            methods,
            seeds=seeds,
            method_params=method_params,
            out=out_dir,
            jobs=args.jobs,
            rerun=args.rerun,
            progress_bars=prog.callback,
            notify=lambda m: (
                print(f"fedhet: {m}", file=sys.stderr) if m.startswith("note:") else console.print(m)
            ),
        )
    rows = result.rows
    report_path = None
    if not args.no_report:
        from fedhet.report import write_report

        report_path = write_report([out_dir], out_dir / "report.md", title=args.title)
    if args.json:
        print(json.dumps(_jsonable({"rows": rows})))
    else:
        ran = result.config or base  # as the runs saw it: with the method defaults applied
        results = results_console()
        print_compare_table(
            results,
            rows,
            title=f"{ran.data.dataset} · {ran.data.split} · "
            f"{ran.data.clients} clients · {ran.train.rounds} rounds · seeds {seeds}",
        )
        summaries = {m: [r.summary for r in runs] for m, runs in result.runs.items()}
        print_class_recall(results, summaries)
        print_contributions(results, summaries)
        results.print(f"runs and report: {out_dir}" + (f"  ({report_path})" if report_path else ""))
    return 0


#: The per-class recall table is printed for at most this many classes (the report has every class).
MAX_PRINTED_CLASSES = 20


def print_class_recall(console, results: dict[str, list[dict[str, Any]]]) -> None:
    """Final recall of each class (by name) per method, mean over seeds; for at most MAX_PRINTED_CLASSES
    classes (the Markdown report holds the table for any number)."""
    from rich.markup import escape
    from rich.table import Table

    recalls = {
        m: [
            s["final"]["per_class_recall"]
            for s in summaries
            if (s.get("final") or {}).get("per_class_recall")
        ]
        for m, summaries in results.items()
    }
    recalls = {m: r for m, r in recalls.items() if r}
    if not recalls:
        return
    k = len(next(iter(recalls.values()))[0])
    if k > MAX_PRINTED_CLASSES:
        console.print(f"[dim]per-class recall of the {k} classes: in the report[/dim]")
        return
    names = RunNames.of_summary(next(iter(results.values()))[0])
    table = Table(title="final per-class recall %")
    table.add_column("class")
    for m in recalls:
        table.add_column(m, justify="right")
    for c in range(k):
        cells = []
        for rows in recalls.values():
            values = [row[c] for row in rows if row[c] is not None and math.isfinite(row[c])]
            cells.append(fmt_metric("per_class_recall", sum(values) / len(values) if values else None))
        table.add_row(escape(names.class_name(c)), *cells)
    console.print(table)
    console.print("[dim]mean over seeds[/dim]")


def print_contributions(console, results: dict[str, list[dict[str, Any]]]) -> None:
    """Final contribution weights per client (mean over seeds) of every method that estimates them,
    beside FedAvg's sample-count weights; clients with a role in the split (maverick, free rider) are marked.
    """
    from rich.markup import escape
    from rich.table import Table

    rows = {
        m: [s["contributions"] for s in summaries if s.get("contributions")]
        for m, summaries in results.items()
    }
    rows = {m: c for m, c in rows.items() if c}
    if not rows:
        return
    n = max(len(c[0]) for c in rows.values())
    info = next(iter(results.values()))[0].get("partition_info") or {}
    roles = {int(i): "maverick" for i in info.get("maverick_clients") or []}
    if info.get("free_rider") is not None:
        roles[int(info["free_rider"])] = "free rider"
    means = {m: [sum(c[i] for c in cs) / len(cs) for i in range(n)] for m, cs in rows.items()}
    sizes = next(iter(results.values()))[0].get("client_sizes") or []
    names = RunNames.of_summary(next(iter(results.values()))[0])
    table = Table(title="final contribution weights")
    table.add_column("client")
    table.add_column("role")
    if len(sizes) == n:
        table.add_column("n_i/n", justify="right")
    for m in means:
        table.add_column(m, justify="right")
    for i in range(n):
        share = [f"{sizes[i] / sum(sizes):.3f}"] if len(sizes) == n else []
        table.add_row(
            escape(names.client(i)), roles.get(i, ""), *share, *(f"{means[m][i]:.3f}" for m in means)
        )
    console.print(table)
    share_note = "; n_i/n = FedAvg's sample-count weight" if len(sizes) == n else ""
    console.print(f"[dim]mean over seeds; 1/N = {1 / n:.3f}{share_note}[/dim]")


def print_compare_table(console, rows: list[dict[str, Any]], title: str = "") -> None:
    from rich.table import Table

    from fedhet.comparison import VIEW_KEYS

    present = [
        (k, v, label) for k, v, label in TABLE_METRICS if any(k in r.get(VIEW_KEYS[v][0], {}) for r in rows)
    ]
    caption = "mean ± std over seeds"
    if any(v == "last" for _, v, _ in present):
        caption += "; last-10 = mean over the evaluations of the last 10 rounds"
    if any(k == "fairness_pearson" for k, _, _ in present):
        caption += "; fairness = 100·Pearson(standalone, reward acc.)"
    table = Table(title=title, caption=caption)
    table.add_column("method", no_wrap=True)
    for _, _, label in present:
        table.add_column(label, justify="right")
    for r in rows:
        cells = []
        for k, v, _ in present:
            mean, std = (r.get(key, {}) for key in VIEW_KEYS[v])
            cells.append(fmt_metric(k, mean.get(k), std.get(k)))
        diverged = r.get("diverged") or {}
        where = ", ".join(f"seed {seed} round {rnd}" for seed, rnd in sorted(diverged.items()))
        table.add_row(r["method"] + (f" [red](diverged: {where})[/red]" if diverged else ""), *cells)
    console.print(table)
    if any(r.get("diverged") for r in rows):
        console.print(
            "[dim]diverged: the engine stopped the run when no update of several rounds could be used; its "
            "final view is the global model at the stop[/dim]"
        )
