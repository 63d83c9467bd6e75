"""The gated FSSL table: can this run test ProxyFL > SAGE ≥ FixMatch-GPL > labeled-only at all, and does it?

    python tools/gated_fssl.py runs/proxyfl-gated/b [--min-gap 8] [--min-used 0.25]

Reads a ``fedhet compare`` directory of the gated protocol (configs/proxyfl/fashion-mnist-gated.toml) holding
fedavg-labeled, fixmatch-gpl, sage, proxyfl and fedavg-full for the same seeds, and prints the per-seed
table, the validity gates, then the ordering (fedhet.report.fssl_gates; ``fedhet reproduce proxyfl-gated``
writes the same on a result page). A failed gate marks the table "not a test of the claim".
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedhet.report.fssl_gates import fssl_gates, gates_markdown, read_fssl_runs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("compare_dir", type=Path)
    parser.add_argument("--min-gap", type=float, default=8.0)
    parser.add_argument("--min-used", type=float, default=0.25)
    args = parser.parse_args()
    try:
        report = fssl_gates(*read_fssl_runs(args.compare_dir), args.min_gap, args.min_used)
    except ValueError as exc:
        print(f"{args.compare_dir}: {exc}")
        return 2
    print(gates_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
