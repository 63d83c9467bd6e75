"""The ``fedhet`` command: datasets, partition, data describe, run, compare, shapley, report, audit,
reproduce, robustness, study, records, methods, experiments.

One module per command group, each registering its subcommands and holding what they do: ``data``
(datasets, partition), ``describe`` (data describe), ``run``, ``compare``, ``shapley``, ``report`` (report,
audit), ``reproduce``, ``robustness``, ``study``, ``records``, ``catalog`` (methods, experiments); ``common``
holds what they share.
``run`` and ``compare`` parse the command line, build the config once and call :mod:`fedhet.api`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from fedhet.cli import (
    catalog,
    compare,
    data,
    describe,
    records,
    report,
    reproduce,
    robustness,
    run,
    shapley,
    study,
)
from fedhet.cli.common import interrupted_line
from fedhet.errors import CALLER, FedhetError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedhet", description="Federated learning across heterogeneous clients."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    # `fedhet --help` order
    for group in (
        data,
        describe,
        run,
        compare,
        shapley,
        report,
        reproduce,
        robustness,
        study,
        records,
        catalog,
    ):
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING
    fresh = not logging.getLogger().handlers
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if fresh:  # the handler basicConfig made: hold it to the level too, since a library logger set lower
        # than the root (Flower's "flwr" is at DEBUG) hands it every record; Flower prints its own records
        # with its own handler, so without --verbose they are not printed a second time here
        handler = logging.getLogger().handlers[0]
        handler.setLevel(level)
        if not args.verbose:
            handler.addFilter(lambda record: record.name != "flwr" and not record.name.startswith("flwr."))
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a resume command repeats
    token = CALLER.set("cli")  # advice in errors names flags (--overwrite), not keywords (overwrite=True)
    try:
        return int(args.func(args) or 0)
    except FedhetError as exc:
        print(f"fedhet: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C: one line, the command that resumes, no traceback
        print(f"fedhet: {interrupted_line(exc, getattr(args, 'resume_command', None))}", file=sys.stderr)
        return 130
    finally:
        CALLER.reset(token)
