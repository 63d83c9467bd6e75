"""How often are the audit's flags right? Precision and recall per flag against the ground truth the
simulation knows (docs/audit.md).

``run`` compares, per setting: ``free-rider`` (celm/fmnist-free-rider: N = 5, client 0 trains on 10
samples; CELM and CGSV), ``maverick`` (celm/fmnist-maverick: N = 10, client 0 alone holds class 0; CELM),
``faults`` (robustness/fmnist-n10: N = 10, Dir(0.5), client 0 stale, client 1 crashing, client 2 sending
NaN; CELM). ``table`` audits every run (``fedhet.report.audit``, which never reads the truth) and compares
each flag's clients with :func:`fedhet.report.audit.ground_truth` (every holder of ≥ 50 % of a class's
samples; the injected faults, the stale client being a free rider too), pooled over the (run, client) pairs
of all settings. The free-rider split's client trains on its 10 samples and sends that update: it is no
free-rider truth (the audit's free-rider suspect is a client whose updates carry no information).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedhet.report.audit import FLAGS, AuditSettings, flag_table, ground_truth, load_audit, tally_flag
from fedhet.report.markdown import find_runs
from fedhet.studies.base import CompareCell, Study

SETTINGS = {
    "free-rider": ("celm/fmnist-free-rider", ("celm", "cgsv"), {}),
    "maverick": ("celm/fmnist-maverick", ("celm",), {}),
    "faults": (
        "robustness/fmnist-n10",
        ("celm",),
        {"faults.clients.0": "stale", "faults.clients.1": "crash", "faults.clients.2": "nan"},
    ),
}


def cells() -> list[CompareCell]:
    return [CompareCell(name, config, methods, sets) for name, (config, methods, sets) in SETTINGS.items()]


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    out, settings = dirs[0], AuditSettings()
    kinds = [kind for kind in FLAGS if kind != "low marginal value"]  # no truth for it here (ground_truth)
    counts: dict[tuple[str, str], dict[str, int]] = {}
    by_setting: dict[str, list[str]] = {}
    for name in SETTINGS:
        if not (out / name).is_dir():
            continue
        for run_dir in find_runs([out / name]):
            audit = load_audit(run_dir, settings)
            truth = ground_truth(run_dir, settings)
            for kind in kinds:
                tally_flag(counts, kind, audit.method, set(audit.flagged(kind)), set(truth[kind]))
            by_setting.setdefault(name, []).append(
                f"{audit.method} seed {audit.seed}: "
                + "; ".join(
                    f"{k} flagged {audit.flagged(k)} / true {truth[k]}"
                    for k in kinds
                    if audit.flagged(k) or truth[k]
                )
            )
    lines = flag_table(counts, kinds)
    for name, found in by_setting.items():
        lines += ["", f"{name}:", *(f"- {row}" for row in found)]
    return "\n".join(lines)


STUDY = Study(
    name="audit-validation",
    title="the audit's flags (free rider, maverick, faults) against the simulation's ground truth",
    page="docs/audit.md",
    default_out="runs/audit-validation",
    default_seeds=5,
    cells=cells,
    table=table,
)
