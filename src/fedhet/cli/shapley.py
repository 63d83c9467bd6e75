"""``fedhet shapley``: exact Shapley, Banzhaf and leave-one-out values of a federation's clients, by training
the model of every coalition (fedhet.ground_truth)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fedhet.cli.common import (
    RunProgress,
    add_experiment_args,
    build_config,
    results_console,
    status_console,
    writable_dir,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "shapley",
        help="exact Shapley values: train every coalition of the clients (ground truth for contributions)",
        description="Train the model of every coalition of the federation's N ≤ 12 clients (same split, "
        "seed, rounds and initial model; FedAvg's coalitions train together, any other method one at a "
        "time) and report each client's exact Shapley, Banzhaf and leave-one-out value of test accuracy, "
        "over seeds. Coalitions are trained with the server's guards off. Each seed is recorded in --out "
        "and reused.",
    )
    add_experiment_args(p)
    p.add_argument("--seeds", type=int, default=3, help="seeds seed, seed+1, … (default 3)")
    p.add_argument(
        "--out", help="folder of the records (default runs/shapley/<method>-<dataset>-<split>-n<N>)"
    )
    p.add_argument(
        "--utility",
        choices=["accuracy", "balanced_accuracy"],
        default="accuracy",
        help="what a coalition's model is worth (default test accuracy)",
    )
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="train the coalitions one embedded run at a time (the reference the stacked path is tested "
        "against)",
    )
    p.set_defaults(func=cmd_shapley)


def cmd_shapley(args: argparse.Namespace) -> int:
    from fedhet.errors import ConfigError
    from fedhet.ground_truth.coalitions import check_federation
    from fedhet.ground_truth.measure import measure

    cfg = build_config(args)
    check_federation(cfg)
    if args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds}: pass 1 or more")
    name = f"{cfg.method.name}-{cfg.data.dataset}-{cfg.data.split}-n{cfg.data.clients}"
    out = writable_dir(Path(args.out) if args.out else Path("runs") / "shapley" / name, "--out")
    console = status_console(args)
    seeds = [cfg.seed + k for k in range(args.seeds)]
    with RunProgress(console, enabled=not args.quiet, lazy=True) as prog:
        bars: dict[int, Any] = {}

        def progress(seed: int, done: int, total: int) -> None:
            if seed not in bars:
                bars[seed] = prog.callback(f"seed {seed}", total)
            bars[seed](done, total, {})

        truth = measure(
            cfg,
            seeds,
            out,
            one_at_a_time=args.one_at_a_time,
            utility=args.utility,
            progress=progress,
            notify=lambda message: print(f"fedhet: {message}", file=sys.stderr),
        )
    if args.json:
        print(json.dumps(truth.to_json()))
        return 0
    print_values(results_console(), cfg, truth)
    return 0


def print_values(console, cfg: Any, truth: Any) -> None:
    """The table of values per client (mean ± 95 % half-width over seeds) and where the records are."""
    from rich.table import Table

    n = cfg.data.clients
    percent = 100.0
    label = truth.utility.replace("_", " ")
    table = Table(
        title=f"Exact values of {label} (points), {cfg.method.name} on {cfg.data.dataset} "
        f"({cfg.data.split}, {n} clients, {cfg.train.rounds} rounds), "
        f"seeds {truth.seeds[0]}–{truth.seeds[-1]}"
    )
    table.add_column("client")
    for name in ("Shapley", "Banzhaf", "leave-one-out"):
        table.add_column(name, justify="right")
    table.add_column("Shapley rank", justify="right")
    shapley_mean, _ = truth.interval("shapley")
    order = sorted(range(n), key=lambda i: -shapley_mean[i])
    rank = {client: position + 1 for position, client in enumerate(order)}
    for i in range(n):
        cells = []
        for key in ("shapley", "banzhaf", "leave_one_out"):
            mean, half = truth.interval(key)
            spread = "" if half[i] != half[i] else f" ± {percent * half[i]:.2f}"
            cells.append(f"{percent * mean[i]:+.2f}{spread}")
        table.add_row(str(i), *cells, str(rank[i]))
    console.print(table)
    full, empty = truth.full.mean(), truth.empty.mean()
    console.print(
        f"whole federation {percent * full:.2f} %, untrained model {percent * empty:.2f} %: the Shapley "
        f"values add up to the difference ({percent * (full - empty):.2f} points); ± is the 95 % t-interval "
        "over seeds"
    )
    reused = sum(truth.reused)
    console.print(
        f"records: {truth.records[0].parent} ({reused} of {len(truth.seeds)} seeds reused; "
        f"{sum(w for w, r in zip(truth.wall_s, truth.reused, strict=True) if not r):.1f} s trained now)"
    )
