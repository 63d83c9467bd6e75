"""How often are the audit's flags right? Precision and recall per flag against the ground truth the
simulation knows (docs/audit.md).

    python tools/audit_validation.py run   [--seeds 5] [--jobs 2] [--out runs/audit-validation]
    python tools/audit_validation.py table [--out runs/audit-validation]

``run`` calls ``fedhet compare`` once per setting (finished cells are reused, so an interrupted run
resumes):

- ``free-rider``: celm/fmnist-free-rider (N = 5, client 0 trains on 10 samples), CELM and CGSV;
- ``maverick``: celm/fmnist-maverick (N = 10, client 0 alone holds class 0), CELM;
- ``faults``: configs/robustness/fmnist-n10.toml (N = 10, Dir(0.5)) with client 0 stale, client 1 crashing
  and client 2 sending NaN, CELM.

``table`` audits every run (``fedhet.report.audit``, which never reads the truth) and compares each flag's
clients with :func:`fedhet.report.audit.ground_truth` (the split's free rider; every holder of ≥ 50 % of a
class's samples; the injected faults), pooled over the (run, client) pairs of all settings.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from fedhet.report.audit import FLAGS, AuditSettings, ground_truth, load_audit
from fedhet.report.markdown import find_runs

SETTINGS: dict[str, tuple[str, str, list[str]]] = {
    "free-rider": ("configs/celm/fmnist-free-rider.toml", "celm,cgsv", []),
    "maverick": ("configs/celm/fmnist-maverick.toml", "celm", []),
    "faults": (
        "configs/robustness/fmnist-n10.toml",
        "celm",
        ["faults.clients.0=stale", "faults.clients.1=crash", "faults.clients.2=nan"],
    ),
}


def run(out: Path, seeds: int, jobs: int) -> None:
    for name, (config, methods, sets) in SETTINGS.items():
        cmd = [
            sys.executable, "-m", "fedhet.cli", "compare", config, "--methods", methods,
            "--seeds", str(seeds), "--jobs", str(jobs), "--out", str(out / name), "--quiet", "--no-report",
            *[a for s in sets for a in ("--set", s)],
        ]  # fmt: skip
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def table(out: Path) -> None:
    settings = AuditSettings()
    counts = {kind: {"tp": 0, "fp": 0, "fn": 0} for kind in FLAGS}
    by_method: dict[tuple[str, str], dict[str, int]] = {}
    by_setting: dict[str, list[str]] = {}
    for name in SETTINGS:
        if not (out / name).is_dir():
            continue
        for run_dir in find_runs([out / name]):
            audit = load_audit(run_dir, settings)
            truth = ground_truth(run_dir, settings)
            for kind in FLAGS:
                flagged, true = set(audit.flagged(kind)), set(truth[kind])
                for c in (
                    counts[kind],
                    by_method.setdefault((kind, audit.method), {"tp": 0, "fp": 0, "fn": 0}),
                ):
                    c["tp"] += len(flagged & true)
                    c["fp"] += len(flagged - true)
                    c["fn"] += len(true - flagged)
            by_setting.setdefault(name, []).append(
                f"{audit.method} seed {audit.seed}: "
                + "; ".join(
                    f"{k} flagged {audit.flagged(k)} / true {truth[k]}"
                    for k in FLAGS
                    if audit.flagged(k) or truth[k]
                )
            )
    print("| flag | method | true positives | false positives | missed | precision | recall |")
    print("|---|---|---|---|---|---|---|")
    rows = [((kind, "all"), c) for kind, c in counts.items()] + sorted(by_method.items())
    for (kind, method), c in sorted(rows, key=lambda r: (FLAGS.index(r[0][0]), r[0][1] != "all", r[0][1])):
        flagged, true = c["tp"] + c["fp"], c["tp"] + c["fn"]
        precision = f"{100 * c['tp'] / flagged:.0f} %" if flagged else "— (nothing flagged)"
        recall = f"{100 * c['tp'] / true:.0f} %" if true else "— (no true case)"
        print(f"| {kind} | {method} | {c['tp']} | {c['fp']} | {c['fn']} | {precision} | {recall} |")
    for name, rows in by_setting.items():
        print(f"\n{name}:")
        for row in rows:
            print(f"- {row}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("run", "table"))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/audit-validation"))
    args = ap.parse_args()
    if args.what == "run":
        run(args.out, args.seeds, args.jobs)
    table(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
