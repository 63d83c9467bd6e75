"""``fedhet report`` and ``fedhet audit``: Markdown (and HTML) built from run directories."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedhet.cli.common import writable_file


def register(sub: argparse._SubParsersAction) -> None:
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
        "low marginal value, low weight, maverick, rejected updates, failed rounds, stale uploads, ...) with "
        "the "
        "evidence behind each",
        description="Audit run directories of methods that estimate contributions or rewards (CELM, CGSV, "
        "ShapFed, CFFL, IAFL, FedRAC, FedSAC). Flags: free-rider suspect = updates that carry no "
        "information, whatever the weight (the median over the kept rounds of |cos| with the round's "
        "other updates x sqrt(weights compared) < 2, or a norm repeated round after round); low marginal "
        "value = a standalone accuracy whose gain over chance is < 0.75 x the clients' mean gain (where the "
        "run recorded standalone accuracies); low weight = the method's view: a final weight < 0.75/N (for "
        "methods without class evidence: in >= 80% of the rounds); "
        "maverick = >= 50% of a class's samples as described in round 0; rejected updates / clipped "
        "updates / failed rounds as recorded; stale uploads = an update norm below 0.01 x the round's "
        "median; starved class. See docs/audit.md for their measured precision and recall.",
    )
    p.add_argument("run_dirs", nargs="+", help="run or compare directories")
    p.add_argument("--out", help="report file (default audit.md; figures in AUDIT_figures/)")
    p.add_argument("--html", action="store_true", help="also write one self-contained HTML file")
    p.set_defaults(func=cmd_audit)


def cmd_report(args: argparse.Namespace) -> int:
    from fedhet.report import find_runs, write_report

    if args.fairness:
        from fedhet.report.fairness import fairness_table

        print(fairness_table(find_runs([Path(p) for p in args.run_dirs]), last=args.last))
        return 0
    out = writable_file(Path(args.out) if args.out else Path("report.md"), "--out")
    path = write_report([Path(p) for p in args.run_dirs], out, title=args.title)
    print(f"report written to {path}")
    if args.html:
        from fedhet.report.html import write_html

        print(f"self-contained HTML (figures embedded) written to {write_html(path)}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from fedhet.report.audit import FLAGS, write_audit
    from fedhet.report.html import write_html

    out = writable_file(Path(args.out) if args.out else Path("audit.md"), "--out")
    path, audits = write_audit([Path(p) for p in args.run_dirs], out)
    for a in audits:
        counts = ", ".join(
            f"{kind} [{', '.join(a.names.client(c) for c in a.flagged(kind))}]"
            for kind in FLAGS
            if a.flagged(kind)
        )
        print(f"{a.run_dir}: {a.method} seed {a.seed}: {counts or 'no flags'}")
    print(f"audit written to {path}")
    if args.html:
        print(f"self-contained HTML (figures embedded) written to {write_html(path, title='fedhet audit')}")
    return 0
