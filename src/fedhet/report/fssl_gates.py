"""Validity gates of the gated FSSL protocol (docs/proxyfl.md): can a table test ProxyFL > SAGE ≥
FixMatch-GPL > labeled-only at all, and what do its seeds say of each step?

The gates ask whether the protocol can test the ordering: all labels − labeled-only ≥ ``min_gap`` points
(there is room to gain from unlabeled data); FixMatch-GPL uses ≥ ``min_used`` of the unlabeled samples
(pseudo-labels pass τ); ProxyFL ≤ all labels (the bound holds). Each step of the ordering is then judged by
its paired differences over seeds as every computed finding is (:mod:`fedhet.verdicts`: holds,
contradicted or not resolved). Used by ``fedhet study gated-fssl`` and by the ``proxyfl-gated`` page.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhet.engine.rundir import is_finished, read_metrics, read_summary
from fedhet.verdicts import CONTRADICTED, HOLDS, UNRESOLVED, judge

#: The claimed ordering as (better, worse) pairs, paired by seed.
ORDER = (("proxyfl", "sage"), ("sage", "fixmatch-gpl"), ("fixmatch-gpl", "fedavg-labeled"))
NAMES = {
    "fedavg-labeled": "labeled-only",
    "fixmatch-gpl": "FixMatch-GPL",
    "sage": "SAGE",
    "proxyfl": "ProxyFL",
    "fedavg-full": "all labels",
}


#: The per-round metric of the fraction of unlabeled samples whose pseudo-label passed the mask.
USED_KEY = "unlabeled_used_fraction"


@dataclass
class GateReport:
    """Per-method accuracies, the gates (text, passed) and each step of the ordering (text, verdict)."""

    seeds: list[int]
    accuracy: dict[str, dict[int, float]]
    used: dict[str, dict[int, float]]
    gates: list[tuple[str, bool]]
    ordering: list[tuple[str, str]]

    @property
    def valid(self) -> bool:
        return all(ok for _, ok in self.gates)

    @property
    def verdict(self) -> str:
        """The ordering as a whole: holds when every step holds, contradicted when one is, else not
        resolved (and nothing at all when a gate failed: the protocol cannot test it)."""
        steps = [v for _, v in self.ordering]
        if all(v == HOLDS for v in steps):
            return HOLDS
        return CONTRADICTED if CONTRADICTED in steps else UNRESOLVED


def read_fssl_runs(compare_dir: Path) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    """Per method and seed: the mean accuracy of the last 10 rounds (%, ``summary["last"]``), and the mean
    fraction of unlabeled samples that passed the mask (metrics.jsonl)."""
    acc: dict[str, dict[int, float]] = {}
    used: dict[str, dict[int, float]] = {}
    for run in sorted(p for p in compare_dir.iterdir() if is_finished(p)):
        summary = read_summary(run)
        method, seed = summary["method"], int(summary["seed"])
        acc.setdefault(method, {})[seed] = 100 * float(summary["last"]["accuracy"])
        lines = read_metrics(run)
        fractions = [ln[USED_KEY] for ln in lines if USED_KEY in ln]
        if fractions:
            used.setdefault(method, {})[seed] = float(np.mean(fractions))
    return acc, used


def fssl_inputs_from_records(
    records: list[dict],
) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    """What :func:`read_fssl_runs` reads from runs, from their cell records (``fedhet.reproduce.cells``): the
    ``last`` view's accuracy (%) and the mean over rounds of the unlabeled fraction used (``round_means``)."""
    acc: dict[str, dict[int, float]] = {}
    used: dict[str, dict[int, float]] = {}
    for record in records:
        method, seed = record["method"], int(record["seed"])
        last = (record.get("views") or {}).get("last") or {}
        if last.get("accuracy") is not None:
            acc.setdefault(method, {})[seed] = 100 * float(last["accuracy"])
        fraction = (record.get("round_means") or {}).get(USED_KEY)
        if fraction is not None:
            used.setdefault(method, {})[seed] = float(fraction)
    return acc, used


def fssl_gates(
    acc: dict[str, dict[int, float]],
    used: dict[str, dict[int, float]],
    min_gap: float = 8.0,
    min_used: float = 0.25,
) -> GateReport:
    """The gates and the ordering over the seeds every method has (docs/proxyfl.md)."""
    missing = [m for m in NAMES if m not in acc]
    if missing:
        raise ValueError(f"the gated FSSL table needs runs of {sorted(NAMES)}; missing {missing}")
    seeds = sorted(set.intersection(*(set(acc[m]) for m in NAMES)))
    mean = {m: float(np.mean([acc[m][s] for s in seeds])) for m in NAMES}
    gap = mean["fedavg-full"] - mean["fedavg-labeled"]
    gpl_used = float(np.mean(list(used.get("fixmatch-gpl", {0: 0.0}).values())))
    gates = [
        (f"all labels − labeled-only ≥ {min_gap:g} points ({gap:+.2f})", gap >= min_gap),
        (
            f"GPL uses ≥ {100 * min_used:g} % of the unlabeled samples ({100 * gpl_used:.1f} %)",
            gpl_used >= min_used,
        ),
        (
            f"ProxyFL ≤ all labels ({mean['proxyfl']:.2f} vs {mean['fedavg-full']:.2f})",
            mean["proxyfl"] <= mean["fedavg-full"],
        ),
    ]
    ordering = []
    for a, b in ORDER:
        diffs = [acc[a][s] - acc[b][s] for s in seeds]
        verdict, low, high = judge(diffs)
        relation = "≥" if (a, b) == ("sage", "fixmatch-gpl") else ">"
        interval = "" if low is None else f", 95 % interval [{low:+.2f}, {high:+.2f}]"
        by_seed = ", ".join(f"{d:+.2f}" for d in diffs)
        text = f"{NAMES[a]} {relation} {NAMES[b]}: mean {np.mean(diffs):+.2f}{interval} (by seed: {by_seed})"
        ordering.append((text, verdict))
    return GateReport(seeds=seeds, accuracy=acc, used=used, gates=gates, ordering=ordering)


def gates_markdown(report: GateReport) -> str:
    """The per-seed table, the gates, then the ordering and the verdict (Markdown)."""
    seeds = report.seeds
    lines = [
        f"Accuracy = mean of the last 10 rounds, %, seeds {seeds}.",
        "",
        "| method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± std | unlabeled used |",
        "|---|" + "---|" * len(seeds) + "---|---|",
    ]
    for m, name in NAMES.items():
        values = [report.accuracy[m][s] for s in seeds]
        frac = f"{100 * np.mean(list(report.used[m].values())):.1f} %" if m in report.used else "—"
        cells = " | ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {name} | {cells} | {np.mean(values):.2f} ± {np.std(values):.2f} | {frac} |")
    lines += ["", "Validity gates:", ""]
    lines += [f"- [{'pass' if ok else 'FAIL'}] {text}" for text, ok in report.gates]
    lines += [
        "",
        "Ordering ProxyFL > SAGE ≥ FixMatch-GPL > labeled-only, each step by its paired differences over "
        f"{len(seeds)} seed(s) (holds only when the 95 % t-interval excludes 0 in the claimed direction):",
        "",
    ]
    lines += [f"- **{verdict}**: {text}" for text, verdict in report.ordering]
    if report.valid:
        overall = f"the gates pass; the ordering as a whole **{report.verdict}** at {len(seeds)} seed(s)"
    else:
        overall = "a validity gate failed: this table cannot test the ordering, whatever its steps say"
    lines += ["", f"**Verdict:** {overall}."]
    return "\n".join(lines) + "\n"
