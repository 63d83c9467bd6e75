"""``fedhet datasets`` and ``fedhet partition``: which data sets are here, and how a split deals one out."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fedhet.cli.common import build_config, make_console


def register(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument(
        "--export-sites",
        metavar="DIR",
        help="write each client's data to DIR/<site>/ as a deployment node reads it (docs/flower.md)",
    )
    p.add_argument("--force", action="store_true", help="with --export-sites: replace what DIR holds")
    p.set_defaults(func=cmd_partition)


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
    cfg = build_config(args)
    if args.export_sites:
        from fedhet.flower.sites import export_sites

        for site in export_sites(cfg, args.export_sites, force=args.force):
            print(f"client {site.cid}: {site.rows} rows in {site.folder}")
            print(f'  flower-supernode --superlink SUPERLINK:9092 --node-config "{site.node_config}"')
        print(f"node configs in {args.export_sites}/nodes.txt; commands in {args.export_sites}/README.md")
        return 0
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
