"""``fedhet robustness``: the robustness table of every attack against every defence, and its results page.

    fedhet robustness run [--out DIR] [--seeds N] [--jobs N]     # the cells (resumable), then the page
    fedhet robustness page [--out DIR]                            # the page from the records (and runs)

The cells are those of ``fedhet study robustness`` (:mod:`fedhet.studies.robustness`). Each finished run is
recorded under docs/results/cells/robustness/ of the checkout (or ``--root``); ``run`` skips the seeds
recorded there under the same results stamp, so the table fills across sessions even when the runs are
gone. ``page`` records the finished runs of ``--out`` and writes docs/results/robustness.md and
docs/figures/robustness.png from the records.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "robustness",
        help="hostile clients against every defence and contribution method: run the table, write its page",
        description="Every injected attack, by 1 and 3 of 10 clients, against FedAvg, the robust aggregation "
        "rules and CELM, CGSV, ShapFed and FedRAC with fedhet's defaults (docs/results/robustness.md).",
    )
    p.add_argument(
        "action", choices=("run", "page"), help="run: make the cells, then the page; page: only the page"
    )
    p.add_argument(
        "--out", type=Path, default=Path("runs/robustness"), help="the runs (default runs/robustness)"
    )
    p.add_argument("--seeds", type=int, default=3, help="run: seeds 0..N-1, every cell's seed 0 first")
    p.add_argument("--jobs", type=int, default=1, help="run: cells at once, one process each")
    p.add_argument(
        "--root", type=Path, default=None, help="the checkout whose docs/ get the page (default: fedhet's)"
    )
    p.add_argument("--no-figure", action="store_true", help="page: leave the figure as it is")
    p.set_defaults(func=cmd_robustness)


def cmd_robustness(args: argparse.Namespace) -> int:
    from fedhet.errors import ConfigError
    from fedhet.studies import get_study, run_study
    from fedhet.studies.robustness import RECORDS
    from fedhet.studies.robustness_page import write_page

    root = args.root or Path(__file__).resolve().parents[3]
    if not (root / "docs").is_dir():
        raise ConfigError(
            f"{root} has no docs/ folder; pass --root with the fedhet checkout to write the page in"
        )
    records = root / RECORDS
    if args.action == "run":
        run_study(
            get_study("robustness"),
            args.out,
            args.seeds,
            args.jobs,
            echo=lambda s: print(s, flush=True),
            records=records,
        )
    elif not (args.out.is_dir() or records.is_dir()):
        raise ConfigError(
            f"neither {args.out} nor {records} exists; run `fedhet robustness run --out {args.out}` first"
        )
    path = write_page(args.out, root, draw=not args.no_figure)
    print(f"wrote {path}")
    return 0
