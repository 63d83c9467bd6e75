"""How often are the audit's flags right? Precision and recall per flag against the ground truth the
simulation knows, on Fashion-MNIST (docs/audit.md; the contribution-estimators study measures the same on
digits and the diabetes sites, with exact Shapley values, and its records back docs/audit.md's table).

``run`` compares, per setting: ``free-rider`` (celm/fmnist-free-rider: N = 5, client 0 trains on 10
samples and sends real updates, client 1 re-sends its first update every round; CELM and CGSV),
``maverick`` (celm/fmnist-maverick: N = 10, client 0 alone holds class 0; CELM), ``faults``
(robustness/fmnist-n10: N = 10, Dir(0.5), client 0 stale, client 1 crashing, client 2 sending NaN; CELM).
``table`` audits every run (``fedhet.report.audit``, which never reads the truth) and compares each flag's
clients with :func:`fedhet.report.audit.ground_truth` (every holder of ≥ 50 % of a class's samples; the
injected faults, the stale and the replaying client being free riders too), pooled over the (run, client)
pairs of all settings. The free-rider split's 10-sample client is no free-rider truth (it sends what it
learnt); the replaying client is the setting's free rider, so the flag has a truth to be judged against
there. Low marginal value and low weight have no truth without exact Shapley values and are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedhet.report.audit import (
    FLAGS,
    NO_RUN_TRUTH,
    AuditSettings,
    flag_table,
    ground_truth,
    load_audit,
    tally_flag,
)
from fedhet.report.markdown import find_runs
from fedhet.studies.base import CompareCell, Study

SETTINGS = {
    # the split's 10-sample client sends real updates (no free rider); client 1 re-sends its first update
    "free-rider": ("celm/fmnist-free-rider", ("celm", "cgsv"), {"faults.clients.1": "replay"}),
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
    kinds = [kind for kind in FLAGS if kind not in NO_RUN_TRUTH]  # no truth for them here (ground_truth)
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
