"""``fedhet data describe``: what a table holds — columns, sites, classes, test rows, warnings — before any
training, from the same flags or config a run takes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fedhet.cli.common import add_experiment_args, build_config
from fedhet.errors import ConfigError

#: The data sets ``fedhet data describe`` reads: tables fedhet reads from files.
TABLE_KINDS = ("csv", "parquet")


def register(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser("data", help="look at your own data before training: fedhet data describe")
    commands = group.add_subparsers(dest="data_command", required=True)
    p = commands.add_parser(
        "describe",
        help="a table's columns (type, levels, missing cells per site), sites, classes and test rows, with "
        "warnings; takes the flags or config of `fedhet run` and never trains",
    )
    add_experiment_args(p)
    p.set_defaults(func=cmd_describe)


def table_description(cfg: Any) -> dict[str, Any]:
    """The description of the table a run of ``cfg`` reads (data.dataset = csv / parquet)."""
    from fedhet.data.datasets.table_description import describe_table_files
    from fedhet.engine.simulation import table_options

    d = cfg.data
    if d.dataset not in TABLE_KINDS:
        raise ConfigError(
            f"fedhet data describe reads a table (data.dataset = 'csv' or 'parquet' with data.path), not "
            f"{d.dataset!r}: `fedhet datasets` lists the built-in data sets, `fedhet partition` shows a split"
        )
    return describe_table_files(d.dataset, d.path, d.root, **table_options(cfg))


def short_description(cfg: Any) -> list[str]:
    """The first lines a table run prints on stderr (rows per site, columns, classes); none for other data."""
    from fedhet.data.datasets.table_description import describe_short

    if cfg.data.dataset not in TABLE_KINDS:
        return []
    return describe_short(table_description(cfg))


def cmd_describe(args: argparse.Namespace) -> int:
    from fedhet.data.datasets.table_description import describe_text

    description = table_description(build_config(args))
    if args.json:
        print(json.dumps(description, indent=2))
    else:
        print(describe_text(description))
    sys.stdout.flush()
    return 0
