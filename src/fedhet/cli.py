"""The ``fedhet`` command: datasets, partition, run, compare, report."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError, FedhetError

# --------------------------------------------------------------------------------------------------------
# Shared argument groups
# --------------------------------------------------------------------------------------------------------
SHORTCUTS = {
    "method": "method.name",
    "dataset": "data.dataset",
    "split": "data.split",
    "model": "model.name",
    "clients": "data.clients",
    "rounds": "train.rounds",
    "seed": "seed",
    "data_root": "data.root",
    "data_path": "data.path",
    "device": "train.device",
}


def _add_experiment_args(p: argparse.ArgumentParser, *, with_method: bool = True) -> None:
    p.add_argument("config", nargs="?", help="experiment TOML file (see configs/); flags override it")
    if with_method:
        p.add_argument("--method", help="method name (see `fedhet methods`)")
    p.add_argument("--dataset", help="dataset name (see `fedhet datasets`), or npz / folder with --data-path")
    p.add_argument("--split", help="data split name (see `fedhet partition --help`)")
    p.add_argument("--model", help="model name: mlp, cnn, mlp200, resnet8, resnet18gn")
    p.add_argument("--clients", type=int, help="number of clients")
    p.add_argument("--rounds", type=int, help="communication rounds")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--data-root", dest="data_root", help="directory holding the dataset files")
    p.add_argument(
        "--data-path", dest="data_path", help="your own data: an .npz file or an image folder (train/, test/)"
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device (default auto)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config key, e.g. --set data.split_params.alpha=0.05 (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress display")


def _build_config(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> Any:
    from fedhet.config import ExperimentConfig, apply_override, load_config, parse_set_args

    cfg = load_config(args.config) if args.config else ExperimentConfig()
    for attr, dotted in SHORTCUTS.items():
        if attr in skip:
            continue
        value = getattr(args, attr, None)
        if value is not None:
            apply_override(cfg, dotted, value if not isinstance(value, str) else json.dumps(value))
    for key, value in parse_set_args(args.set):
        apply_override(cfg, key, value)
    return cfg


#: Columns for tables written to a pipe or a log file (rich's default there is 80, which wraps them).
PIPED_WIDTH = 200


def make_console(*, stderr: bool = False, quiet: bool = False):
    """A rich console: rich sizes it on a terminal or with $COLUMNS set; otherwise PIPED_WIDTH wide."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or "COLUMNS" in os.environ else PIPED_WIDTH
    return Console(stderr=stderr, quiet=quiet, width=width)


def _console(args: argparse.Namespace):
    return make_console(stderr=True, quiet=getattr(args, "quiet", False))


class RunProgress:
    """A rich progress bar per run: round, accuracy, ETA."""

    def __init__(self, console, enabled: bool = True) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.enabled = enabled and not console.quiet
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("round {task.completed}/{task.total}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            disable=not self.enabled,
        )

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def callback(self, description: str, total: int):
        task = self.progress.add_task(description, total=total, status="")

        def update(rnd: int, total_rounds: int, line: dict[str, Any]) -> None:
            status = ""
            if "accuracy" in line and line["accuracy"] is not None and math.isfinite(line["accuracy"]):
                status = f"acc {100 * line['accuracy']:.2f}%"
            if "fairness_pearson" in line and math.isfinite(line.get("fairness_pearson") or float("nan")):
                status += f"  fair {line['fairness_pearson']:.1f}"
            self.progress.update(task, completed=rnd, status=status)

        return update


# --------------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------------
def cmd_datasets(args: argparse.Namespace) -> int:
    from rich.table import Table

    from fedhet.data.datasets import dataset_status

    rows = dataset_status(args.data_root)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    table = Table(title="fedhet datasets")
    for col in ("name", "available", "train", "test", "classes", "shape", "location / note"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["name"],
            "[green]yes" if r["available"] else "[red]no",
            str(r.get("train_size", "")),
            str(r.get("test_size", "")),
            str(r.get("num_classes", "")),
            "x".join(map(str, r.get("input_shape") or ())),
            str(r.get("location") or r.get("note") or ""),
        )
    make_console().print(table)
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from fedhet.data.splits import SPLIT_ADVICE, SPLITS
    from fedhet.engine.simulation import build_federation

    if args.list:
        for name, spec in SPLITS.items():
            params = ", ".join(f"{p.name}={p.default!r}" for p in spec.params)
            print(f"{name}: {spec.doc.splitlines()[0] if spec.doc else ''}\n    params: {params or '-'}")
            if name in SPLIT_ADVICE:
                print(f"    needs: {SPLIT_ADVICE[name]}")
        return 0
    if not args.config and (not args.dataset or not args.split):
        raise SystemExit("fedhet partition: give a config file, or --dataset and --split (or --list)")
    for item in args.param:
        if "=" not in item:
            raise SystemExit(f"--param {item!r} must look like key=value")
    args.set = [f"data.split_params.{item}" for item in args.param] + list(args.set)
    cfg = _build_config(args)
    # The run's own data path (subset, validation hold-out, seeded split): the same clients exactly.
    fed = build_federation(cfg, torch.device("cpu"))
    counts = fed.class_counts
    ds = fed.dataset
    sizes = [int(s) for s in fed.sizes]
    if args.plot:
        from fedhet.report.figures import plot_class_counts

        plot_class_counts(
            counts,
            args.plot,
            title=f"{cfg.data.dataset} / {cfg.data.split} / {cfg.data.clients} clients",
            class_names=list(ds.classes),
        )
    if args.json:
        out: dict[str, Any] = {"sizes": sizes, "counts": np.asarray(counts).tolist()}
        if any(c.unlabeled_indices is not None for c in fed.clients):
            out["unlabeled_sizes"] = [
                int(len(c.unlabeled_indices)) if c.unlabeled_indices is not None else 0 for c in fed.clients
            ]
        if fed.info:
            out["info"] = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in fed.info.items()}
        print(json.dumps(out))
        return 0
    from rich.table import Table

    d = cfg.data
    table = Table(title=f"{d.dataset} · {d.split} · {d.clients} clients · seed {cfg.seed}")
    table.add_column("client")
    for c in range(ds.num_classes):
        table.add_column(str(c), justify="right")
    table.add_column("total", justify="right", style="bold")
    for i, row in enumerate(counts):
        table.add_row(str(i), *[str(int(v)) if v else "·" for v in row], str(sizes[i]))
    make_console().print(table)
    if args.plot:
        print(f"heatmap written to {args.plot}")
    return 0


def _default_run_dir(cfg: Any, prefix: str = "") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.out) if cfg.out else Path("runs")
    name = cfg.name or f"{prefix}{cfg.method.name}-{cfg.data.dataset}-{cfg.data.split}-s{cfg.seed}-{stamp}"
    return base / name


def cmd_run(args: argparse.Namespace) -> int:
    from fedhet.algorithms import build_strategy
    from fedhet.config import load_config
    from fedhet.engine.rundir import check_run_dir
    from fedhet.experiment import (
        apply_method_defaults,
        make_simulation,
        needs_reference,
        standalone_accuracies,
    )

    console = _console(args)
    if args.resume:
        given = [f"--{a.replace('_', '-')}" for a in (*SHORTCUTS, "out") if getattr(args, a, None)]
        given = (["CONFIG"] if args.config else []) + given + [f"--set {x}" for x in args.set]
        if args.overwrite:
            given.append("--overwrite")
        if given:
            raise ConfigError(
                f"--resume {args.resume} continues the run exactly as its config.toml says; "
                f"{', '.join(given)} would change it. Drop them, or start a new run (a new --out)"
            )
        run_dir = Path(args.resume)
        cfg_path = run_dir / "config.toml"
        if not cfg_path.is_file():
            raise SystemExit(f"--resume {run_dir}: no config.toml there; pass a run directory fedhet wrote")
        cfg = load_config(cfg_path)
    else:
        cfg = _build_config(args)
        run_dir = _writable_dir(Path(args.out) if args.out else _default_run_dir(cfg), "--out")
    strategy = build_strategy(cfg.method.name, cfg.method.params)  # a bad method fails before the bar
    if not args.resume:
        for notice in apply_method_defaults(cfg, [strategy]):
            print(f"fedhet: note: {notice}", file=sys.stderr)  # shown with --quiet and --json too
    check_run_dir(run_dir, resume=bool(args.resume), overwrite=args.overwrite)  # and a taken --out
    if args.engine == "flower-simulation":
        if args.resume:
            raise SystemExit(
                "--resume works with the embedded engine only (Flower nodes keep their own state)"
            )
        from fedhet.engine.boundary import check_transport
        from fedhet.flower import require_flower

        require_flower()
        check_transport(strategy, "flower")
    with RunProgress(console, enabled=not args.quiet) as prog:
        reference = None
        if needs_reference(cfg, strategy):  # the standalone pre-pass (cached), with its own bar
            bar = prog.callback(f"standalone seed {cfg.seed} (reference accuracies)", cfg.train.rounds)
            reference = standalone_accuracies(cfg, progress=bar)
        cb = prog.callback(f"{cfg.method.name} seed {cfg.seed}", cfg.train.rounds)
        if args.engine == "flower-simulation":
            from fedhet.flower.server import run_flower_simulation

            summary = run_flower_simulation(
                cfg,
                run_dir,
                strategy=strategy,
                reference_contributions=reference,
                progress=cb,
                overwrite=args.overwrite,
            )
        else:
            summary = make_simulation(
                cfg,
                run_dir=run_dir,
                progress=cb,
                resume=bool(args.resume),
                overwrite=args.overwrite,
                strategy=strategy,
                reference_contributions=reference,
            ).run()
    if args.json:
        from fedhet.engine.rounds import _jsonable

        print(json.dumps(_jsonable(_public_summary(summary))))
    else:
        _print_summary(console, summary)
    return 0


def _public_summary(summary: dict[str, Any]) -> dict[str, Any]:
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
    )
    return {k: summary.get(k) for k in keys}


def _print_summary(console, summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{summary['method']} · {summary['rounds']} rounds · seed {summary['seed']}")
    table.add_column("metric")
    table.add_column("final", justify="right")
    table.add_column("best", justify="right")
    for k, v in summary["final"].items():
        if isinstance(v, list):
            continue
        table.add_row(k, _fmt(k, v), _fmt(k, summary["best"].get(k)))
    console.print(table)
    if summary.get("contributions") is not None:
        console.print("contributions: " + ", ".join(f"{c:.3f}" for c in summary["contributions"]))
    console.print(f"run directory: {summary['run_dir']}  ({summary['wall_time_s']:.1f} s)")


def _fmt(key: str, v: Any, std: Any = None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    pct = key in PERCENT_KEYS
    scale = 100.0 if pct else 1.0
    digits = 2
    s = f"{scale * v:.{digits}f}"
    if std is not None and isinstance(std, float) and math.isfinite(std):
        s += f" ± {scale * std:.{digits}f}"
    return s


PERCENT_KEYS = {"accuracy", "balanced_accuracy", "rare_class_recall"}
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


def _parse_method_params(items: list[str], methods: list[str]) -> dict[str, dict[str, Any]]:
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


def _seeds(args: argparse.Namespace, base_seed: int) -> list[int]:
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


def _writable_dir(path: Path, flag: str) -> Path:
    """``path`` as an output directory: not a file, and creatable/writable (checked before any work)."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file; pass a directory (it is created if missing)")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: {existing} is not writable; pass a directory you can write to")
    return path


def _writable_file(path: Path, flag: str) -> Path:
    """``path`` as an output file: not a directory, in a writable directory."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; pass a file name, e.g. {path / 'report.md'}")
    _writable_dir(path.parent if str(path.parent) else Path("."), f"{flag} {path}: its folder")
    return path


def cmd_compare(args: argparse.Namespace) -> int:
    from fedhet.comparison import aggregate_rows, default_threads, run_comparison, write_rows_csv
    from fedhet.engine.rounds import _jsonable

    console = _console(args)
    base = _build_config(args, skip=("method",))
    if args.jobs < 1:
        raise SystemExit(f"--jobs {args.jobs}: give a number of worker processes >= 1")
    if args.jobs > 1 and base.train.threads is None:
        base.train.threads = default_threads(args.jobs)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise SystemExit("--methods needs at least one method, e.g. --methods fedavg,standalone")
    method_params = _parse_method_params(args.method_param, methods)
    seeds = _seeds(args, base.seed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    default = Path(base.out or "runs") / f"compare-{base.data.dataset}-{base.data.split}-{stamp}"
    out_dir = _writable_dir(Path(args.out) if args.out else default, "--out")
    with RunProgress(console, enabled=not args.quiet) as prog:
        results = run_comparison(
            base,
            methods,
            seeds,
            out_dir,
            method_params,
            progress=prog.callback,
            jobs=args.jobs,
            reuse=not args.rerun,
            notify=lambda m: (
                print(f"fedhet: {m}", file=sys.stderr) if m.startswith("note:") else console.print(m)
            ),
        )
    rows = aggregate_rows(results)
    payload = {"rows": rows, "out_dir": str(out_dir), "config": base.to_dict()}
    (out_dir / "compare.json").write_text(json.dumps(_jsonable(payload), indent=2))
    write_rows_csv(rows, out_dir / "compare.csv")
    report_path = None
    if not args.no_report:
        from fedhet.report import write_report

        report_path = write_report([out_dir], out_dir / "report.md", title=args.title)
    if args.json:
        print(json.dumps(_jsonable({"rows": rows})))
    else:
        print_compare_table(
            console,
            rows,
            title=f"{base.data.dataset} · {base.data.split} · "
            f"{base.data.clients} clients · {base.train.rounds} rounds · seeds {seeds}",
        )
        print_contributions(console, results)
        console.print(f"runs and report: {out_dir}" + (f"  ({report_path})" if report_path else ""))
    return 0


def print_contributions(console, results: dict[str, list[dict[str, Any]]]) -> None:
    """Final contribution weights per client (mean over seeds) of every method that estimates them,
    beside FedAvg's sample-count weights; clients with a role in the split (maverick, free rider) are marked.
    """
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
    table = Table(title="final contribution weights")
    table.add_column("client", justify="right")
    table.add_column("role")
    if len(sizes) == n:
        table.add_column("n_i/n", justify="right")
    for m in means:
        table.add_column(m, justify="right")
    for i in range(n):
        share = [f"{sizes[i] / sum(sizes):.3f}"] if len(sizes) == n else []
        table.add_row(str(i), roles.get(i, ""), *share, *(f"{means[m][i]:.3f}" for m in means))
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
            cells.append(_fmt(k, mean.get(k), std.get(k)))
        diverged = r.get("diverged") or {}
        where = ", ".join(f"seed {seed} round {rnd}" for seed, rnd in sorted(diverged.items()))
        table.add_row(r["method"] + (f" [red](diverged: {where})[/red]" if diverged else ""), *cells)
    console.print(table)
    if any(r.get("diverged") for r in rows):
        console.print(
            "[dim]diverged: the engine stopped the run when no update of several rounds could be used; its "
            "final view is the global model at the stop[/dim]"
        )


def cmd_report(args: argparse.Namespace) -> int:
    from fedhet.report import find_runs, write_report

    if args.fairness:
        from fedhet.report.fairness import fairness_table

        print(fairness_table(find_runs([Path(p) for p in args.run_dirs]), last=args.last))
        return 0
    out = _writable_file(Path(args.out) if args.out else Path("report.md"), "--out")
    path = write_report([Path(p) for p in args.run_dirs], out, title=args.title)
    print(f"report written to {path}")
    if args.html:
        from fedhet.report.html import write_html

        print(f"self-contained HTML (figures embedded) written to {write_html(path)}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from fedhet.report.audit import FLAGS, write_audit
    from fedhet.report.html import write_html

    out = _writable_file(Path(args.out) if args.out else Path("audit.md"), "--out")
    path, audits = write_audit([Path(p) for p in args.run_dirs], out)
    for a in audits:
        counts = ", ".join(f"{kind} {a.flagged(kind)}" for kind in FLAGS if a.flagged(kind))
        print(f"{a.run_dir}: {a.method} seed {a.seed}: {counts or 'no flags'}")
    print(f"audit written to {path}")
    if args.html:
        print(f"self-contained HTML (figures embedded) written to {write_html(path, title='fedhet audit')}")
    return 0


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
    from fedhet.engine.rounds import _jsonable
    from fedhet.reproduce import (
        keep_page_rows,
        list_specs,
        load_spec,
        read_page_rows,
        render_markdown,
        rows_without_data,
        run_spec,
        write_page,
        write_results,
    )

    if args.list or not args.table:
        for name in list_specs():
            spec = load_spec(name)
            offline = len(rows_without_data(spec))
            extra = f"; {offline} row(s) need data not found here (--set data.root=DIR)" if offline else ""
            print(f"{name}: {spec.title} ({len(spec.rows)} rows{extra}; methods {', '.join(spec.methods)})")
        return 0
    console = _console(args)
    spec = load_spec(args.table)
    scale = spec.at_scale(args.scale)
    kept = None
    if args.keep_page_rows:  # read before running: a page of another table or scale stops here, not after
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
    out_dir = _writable_dir(
        Path(args.out) if args.out else Path("runs") / "reproduce" / f"{spec.path.stem}-{scale.name}", "--out"
    )
    if not args.quiet:
        console.print(f"{spec.title}: scale {scale.name} ({scale.note}); output {out_dir}")
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
        )
    wall = time.perf_counter() - started
    md = write_results(spec, results, out_dir, scale=scale.name)
    if args.page:
        from fedhet.report.provenance import commit

        command = reproduce_command(args, spec.path.stem, scale.name)
        page_results = keep_page_rows(spec, results, kept) if kept else results
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

        console.print(Markdown(render_markdown(spec, results, scale=scale.name)))
        console.print(f"written to {md}")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from fedhet.algorithms import accepted_params, build_strategy, describe, method_names, strategy_class
    from fedhet.models.registry import MODEL_NEEDS

    for name in method_names():
        params = ", ".join(accepted_params(strategy_class(name))) or "-"
        print(f"{name}: {describe(name)}\n    params: {params}")
        strategy = build_strategy(name)
        needs = [MODEL_NEEDS[n].split(":")[0] for n in sorted(strategy.model_needs)]
        inputs = {
            "validation": "a server validation set",
            "reference_contributions": "every client's standalone accuracy (a cached pre-pass)",
        }
        needs = [inputs.get(r, r) for r in sorted(strategy.requirements())] + needs
        if needs:
            print(f"    needs: {'; '.join(needs)}")
        defaults = strategy.config_defaults()
        if defaults:
            shown = ", ".join(f"{k} = {v!r}" for k, v in defaults.items())
            print(f"    applies, where left at fedhet's default: {shown}")
    return 0


def cmd_experiments(args: argparse.Namespace) -> int:
    from fedhet.config import describe_experiment, experiment_names

    names = experiment_names()
    if args.json:
        print(json.dumps([{"name": n, "description": describe_experiment(n)} for n in names]))
        return 0
    for name in names:
        print(f"{name}: {describe_experiment(name)}")
    print(f"\n{len(names)} experiments; run one with `fedhet run NAME` (add --rounds N for a short run)")
    return 0


# --------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedhet", description="Federated learning across heterogeneous clients."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("datasets", help="list datasets and whether they are available here")
    p.add_argument("--data-root", dest="data_root")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_datasets)

    p = sub.add_parser(
        "partition",
        help="print the client x class matrix of a split: exactly what `fedhet run` with the same config, "
        "flags and seed trains on",
    )
    p.add_argument("config", nargs="?", help="experiment TOML (its [data] section and seed are used)")
    p.add_argument("--dataset")
    p.add_argument("--split")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="split parameter")
    p.add_argument("--clients", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--data-root", dest="data_root")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any config key")
    p.add_argument("--plot", metavar="FILE.png", help="save the matrix as a heatmap")
    p.add_argument("--json", action="store_true")
    p.add_argument("--list", action="store_true", help="list the splits and their parameters")
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("run", help="run one experiment")
    _add_experiment_args(p)
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

    p = sub.add_parser("compare", help="run several methods on the same splits and seeds; print mean ± std")
    _add_experiment_args(p, with_method=False)
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

    p = sub.add_parser("report", help="Markdown report with tables and figures from run directories")
    p.add_argument("run_dirs", nargs="+", help="run or compare directories")
    p.add_argument("--out", help="report file (default report.md)")
    p.add_argument("--title")
    p.add_argument(
        "--html", action="store_true", help="also write one self-contained HTML file (REPORT.html)"
    )
    p.add_argument(
        "--fairness",
        action="store_true",
        help="print fairness, BCF rates and accuracy (best / final / last-K mean) per run and per method",
    )
    p.add_argument("--last", type=int, default=100, metavar="K", help="the window of --fairness (rounds)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "audit",
        help="who contributed what: per-client weights, ranks, evidence, and flags (free-rider suspect, "
        "maverick, rejected updates, failed rounds, stale uploads) with the evidence behind each",
        description="Audit run directories of methods that estimate contributions or rewards (CELM, CGSV, "
        "ShapFed, CFFL, IAFL, FedRAC, FedSAC). Flags: free-rider suspect = final weight < 0.75/N and "
        "(CELM) evidence on fewer than half the classes or evidence that barely moved over the warm-up, "
        "(others) a weight < 0.75/N in >= 80%% of the rounds; maverick = >= 50%% of a class's de-biased "
        "evidence (CELM); rejected updates / failed rounds as recorded; stale uploads = an update norm "
        "below 0.01 x the round's median. See docs/audit.md for their measured precision and recall.",
    )
    p.add_argument("run_dirs", nargs="+", help="run or compare directories")
    p.add_argument("--out", help="report file (default audit.md; figures in AUDIT_figures/)")
    p.add_argument("--html", action="store_true", help="also write one self-contained HTML file")
    p.set_defaults(func=cmd_audit)

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
        "--rows",
        action="append",
        help="run only rows whose name contains this text (repeat it for rows matching any of several)",
    )
    p.add_argument("--jobs", type=int, default=1, help="worker processes (as in `fedhet compare`)")
    p.add_argument("--methods", help="run only these methods (comma-separated)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--out", help="output directory")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("methods", help="list the methods, their parameters and what they need")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("experiments", help="list the shipped experiments (fedhet run NAME runs one)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_experiments)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except FedhetError as exc:
        print(f"fedhet: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
