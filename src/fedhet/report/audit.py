"""The contribution audit (``fedhet audit RUN_DIR...``): who contributed what, and why the tool says so.

It reads what a run recorded and the server could know: the contribution weights (or rewards) per round,
the self-described sample counts, CELM's per-class evidence, the update norms ‖w_i − w_sent‖, the
rejected or failed updates and the standalone accuracies where the run has them. It never reads the
split's ground truth (``partition.json``): that is kept for :func:`ground_truth`, which validates the
flags (the contribution-estimators study; docs/audit.md).

The flags, each with the numbers behind it (thresholds in :class:`AuditSettings`):

- **free-rider suspect**: a client whose kept updates carried no information, whatever its weight
  (fedhet.report.informativeness): over at least ``min_rounds`` kept rounds, the median of
  |cos(Δ_i, Σ_{j≠i} Δ_j)| × √d (``update_alignment``, recorded per round, over d weights) below
  ``no_alignment`` (noise of any size
  or no update: the model it was sent plus noise, or unchanged), or an update norm repeated within
  ``repeat_tolerance`` (relative) in at least half of its consecutive kept rounds (one update re-sent);
  never a client rejected or failed in the round its final weight comes from (its 0 is the server's doing:
  the rejected / failed flags name it);
- **low marginal value**: a client whose data, trained alone, learns little: its standalone accuracy's
  gain over chance (1/K; the run's pre-pass, recorded in ``standalone`` where the run measured fairness or
  the method needed it) is under ``low_value`` × the clients' mean gain. Exact Shapley's own first term is
  that gain, and on the estimator benchmark it is the estimate that ranks clients most like exact Shapley
  (docs/results/contribution-estimators.md); a run without standalone accuracies gets no such flag. A fact
  about the client's data, not an accusation, and not about its weight;
- **low weight**: a final weight below ``low_weight`` × 1/N (0.75: a quarter under an equal share;
  for a method without class-wise evidence: a weight that low in at least ``persistent`` of the rounds),
  with CELM's evidence on few classes named where it is (class shares ≥ 1/(2N) on fewer than half the
  classes): the method's view of the client, stated as the method's. It is not a measure of marginal value:
  on the benchmark most methods' low weights disagree with exact Shapley more often than they agree;
- **maverick**: the client holds at least ``dominant_share`` of a class's samples as the clients described
  them in round 0 ("sole" from ``sole_share``); for a run recorded without the descriptions, of CELM's
  de-biased evidence of the class;
- **rejected updates** / **failed rounds**: the rounds the server refused the client's update or got none,
  with the first reason;
- **clipped updates**: the rounds the clipping guard shortened the client's update
  (``guards.update_norm_clip``), with the smallest scale: an update far longer than the round's, which an
  honest client of very unusual data can send too;
- **stale uploads**: rounds in which the client's update norm was below ``stale_ratio`` × the round's median
  (a client that sends back what it was sent, or barely trains);
- **starved class**: the only client that described holding a class (round 0's class counts) has a final
  weight below ``starved_weight`` × 1/N: the method all but leaves that client out, so the global model may
  never learn the class.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.config import load_run_config
from fedhet.engine.names import RunNames
from fedhet.engine.records import last_aggregated_line, lost_clients
from fedhet.engine.rundir import (
    CONFIG_FILE,
    PARTITION_FILE,
    RECORDS_FILE,
    SUMMARY_FILE,
    is_finished,
    read_metrics,
    read_summary,
    run_name,
)
from fedhet.errors import ConfigError
from fedhet.report import figures as F
from fedhet.report.artifacts import celm_evidence, float_array
from fedhet.report.informativeness import sends_no_information
from fedhet.report.markdown import find_runs

FLAGS = (
    "free-rider suspect", "low marginal value", "low weight", "maverick", "rejected updates",
    "clipped updates", "failed rounds", "stale uploads", "starved class",
)  # fmt: skip
#: Flags without a truth in a run's own records (:func:`ground_truth`): low marginal value is judged against
#: exact Shapley values (the contribution-estimators study); low weight states what the method did.
NO_RUN_TRUTH = ("low marginal value", "low weight")


@dataclass(frozen=True)
class AuditSettings:
    """The flags' thresholds (module docstring); chosen once, validated in docs/audit.md, not per run."""

    low_weight: float = 0.75
    low_value: float = 0.75  # standalone gain over chance < this × the mean gain (as the truth on Shapley)
    no_alignment: float = 2.0
    repeat_tolerance: float = 1e-5
    min_rounds: int = 3
    persistent: float = 0.8
    dominant_share: float = 0.5
    sole_share: float = 0.9
    stale_ratio: float = 0.01
    starved_weight: float = 0.1


@dataclass
class Flag:
    """One flag on one client, with the evidence behind it in words."""

    client: int
    kind: str
    evidence: str


@dataclass
class Audit:
    """What the audit found in one run directory."""

    run_dir: Path
    method: str
    seed: int
    weights: np.ndarray  # (N,) final weight per client
    weight_source: str  # "contribution" or "reward"
    history: list[tuple[int, list[float]]]  # (round, weights) for every recorded round
    sample_share: np.ndarray | None  # (N,) self-described sample counts / total
    class_shares: np.ndarray | None  # (N, K) share of each class's de-biased evidence (CELM, last warm-up)
    described: np.ndarray | None = None  # (N, K) the class counts each client described in round 0
    standalone: np.ndarray | None = None  # (N,) each client's standalone accuracy (the run's pre-pass)
    evidence_rounds: list[dict[str, Any]] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    #: What the page calls the clients (``1 (south)``) and the classes (fedhet.engine.names).
    names: RunNames = field(default_factory=RunNames)

    @property
    def num_clients(self) -> int:
        return int(self.weights.size)

    def ranks(self) -> np.ndarray:
        """1 = the largest weight (ties share the better rank)."""
        return np.array([1 + int(np.sum(self.weights > w)) for w in self.weights])

    def flagged(self, kind: str) -> list[int]:
        return sorted({f.client for f in self.flags if f.kind == kind})


# --------------------------------------------------------------------------------------------------------
# Reading a run
# --------------------------------------------------------------------------------------------------------
def _class_shares(debiased: np.ndarray) -> np.ndarray:
    """Each client's share of each class's de-biased evidence q_ik / Σ_j q_jk (0 where a class has none)."""
    q = np.nan_to_num(np.asarray(debiased, dtype=np.float64), nan=0.0).clip(min=0.0)
    totals = q.sum(axis=0, keepdims=True)
    return np.divide(q, totals, out=np.zeros_like(q), where=totals > 0)


def _described(counts: dict[str, list[int]] | None, n: int) -> np.ndarray | None:
    """The (N, K) class counts the clients described (a client that sent none: zeros); None for a run
    recorded before summaries kept them."""
    if not counts:
        return None
    k = len(next(iter(counts.values())))
    out = np.zeros((n, k))
    for cid, row in counts.items():
        if int(cid) < n:
            out[int(cid)] = row
    return out


def load_audit(run_dir: Path, settings: AuditSettings | None = None) -> Audit:
    """Read one run directory and flag its clients (:func:`flag_clients`)."""
    if not is_finished(run_dir):
        raise ConfigError(f"{run_dir} holds no {SUMMARY_FILE}; audit finished runs of `fedhet run`/`compare`")
    summary = read_summary(run_dir)
    lines = read_metrics(run_dir, missing_ok=True)
    history = [(int(ln["round"]), ln["contributions"]) for ln in lines if ln.get("contributions")]
    if summary.get("contributions"):
        weights, source = float_array(summary["contributions"]), "contribution"
        total = float(np.nansum(weights))
        if total > 0 and abs(total - 1.0) > 1e-6:  # a reputation scale (data-free FedRAC's ρ): shares of it
            weights = weights / total
    elif summary.get("rewards"):
        weights, source = float_array(summary["rewards"]), "reward"
        history = [(int(ln["round"]), ln["rewards"]) for ln in lines if ln.get("rewards")]
    else:
        raise ConfigError(
            f"{run_dir} ({summary.get('method')}) records no contributions or rewards; the audit reads runs "
            "of methods that estimate them (celm, cgsv, shapfed, cffl, iafl, fedrac, fedsac)"
        )
    sizes = summary.get("client_sizes")
    share = None
    if sizes and len(sizes) == weights.size and sum(sizes) > 0:
        share = np.asarray(sizes, dtype=np.float64) / float(sum(sizes))
    records_path = run_dir / RECORDS_FILE
    records = json.loads(records_path.read_text()) if records_path.is_file() else {}
    # CELM's evidence: CELM's own, or data-free FedRAC's estimate (the same records, under "submodel").
    evidence = celm_evidence(records.get("celm") or records.get("submodel", {}))
    class_shares = _class_shares(evidence[-1]["debiased"]) if evidence else None
    audit = Audit(
        run_dir=run_dir,
        method=str(summary.get("method")),
        seed=int(summary.get("seed", 0)),
        weights=weights,
        weight_source=source,
        history=[(r, list(float_array(w))) for r, w in history],
        sample_share=share,
        class_shares=class_shares,
        evidence_rounds=evidence,
        described=_described(summary.get("described_class_counts"), weights.size),
        # the standalone accuracies (NaN: a client the pre-pass could not train), where the run has them
        standalone=float_array(summary["standalone"]) if summary.get("standalone") else None,
        names=RunNames.of_summary(summary),
    )
    audit.flags = flag_clients(audit, lines, settings or AuditSettings())
    return audit


# --------------------------------------------------------------------------------------------------------
# The flags
# --------------------------------------------------------------------------------------------------------
def flag_clients(audit: Audit, lines: Sequence[dict[str, Any]], s: AuditSettings) -> list[Flag]:
    """Every flag of the module docstring, in client order within each kind."""
    n = audit.num_clients
    uniform = 1.0 / n
    flags: list[Flag] = []
    w = audit.weights
    # A client refused or lost in the round its weight comes from holds 0 because the server did not use it:
    # the rejected / failed flags below say so; calling it a free rider would claim it sent nothing.
    unused = set(lost_clients(last_aggregated_line(lines)))
    silent = sends_no_information(lines, s.no_alignment, s.repeat_tolerance, s.min_rounds)
    silent = {cid: text for cid, text in silent.items() if cid not in unused}
    flags += [Flag(cid, "free-rider suspect", text) for cid, text in sorted(silent.items()) if cid < n]
    flags += [f for f in _low_value_flags(audit, s) if f.client not in silent]
    if audit.weight_source == "contribution":
        low = _low_weight_flags(audit, s, uniform)
        flags += [f for f in low if f.client not in unused and f.client not in silent]
    # who holds a class: the samples each client described in round 0 (what it holds, as the server was
    # told), else CELM's de-biased evidence (runs recorded before summaries kept the descriptions)
    shares, what = audit.class_shares, "evidence"
    if audit.described is not None:
        totals = audit.described.sum(axis=0, keepdims=True)
        shares = np.divide(audit.described, totals, out=np.zeros_like(audit.described), where=totals > 0)
        what = "described samples"
    if shares is not None:
        for i in range(n):
            held = [
                (k, float(shares[i, k])) for k in range(shares.shape[1]) if shares[i, k] >= s.dominant_share
            ]
            if held:
                name = audit.names.class_name
                text = ", ".join(
                    f"class {name(k)}: {'sole' if v >= s.sole_share else 'dominant'} holder "
                    f"({100 * v:.0f} % of its {what})"
                    for k, v in held
                )
                flags.append(Flag(i, "maverick", text + f"; weight {w[i]:.3f} = {w[i] / uniform:.2f} × 1/N"))
    for key, kind in (
        ("rejected", "rejected updates"),
        ("clipped", "clipped updates"),
        ("failed", "failed rounds"),
    ):
        events: dict[int, list[tuple[int, str]]] = {}
        for ln in lines:
            for cid, reason in (ln.get(key) or {}).items():
                events.setdefault(int(cid), []).append((int(ln["round"]), str(reason)))
        for cid in sorted(events):
            rounds = [r for r, _ in events[cid]]
            if key == "clipped":  # the recorded value is the scale the update was multiplied by
                smallest = min(events[cid], key=lambda e: float(e[1]))
                detail = f"smallest scale {float(smallest[1]):.3g} (round {smallest[0]})"
            else:
                detail = "round {}: {}".format(*events[cid][0])
            flags.append(Flag(cid, kind, f"{len(rounds)} round(s) ({_round_list(rounds)}); {detail}"))
    if audit.weight_source == "contribution" and audit.described is not None:
        flags += _starved_class_flags(audit, s, uniform)
    stale: dict[int, list[tuple[int, float, float]]] = {}
    for ln in lines:
        norms = {int(c): float(v) for c, v in (ln.get("update_norms") or {}).items()}
        if len(norms) < 3:  # the median of fewer says nothing
            continue
        median = float(np.median(list(norms.values())))
        for cid, v in norms.items():
            if median > 0 and v < s.stale_ratio * median:
                stale.setdefault(cid, []).append((int(ln["round"]), v, median))
    for cid in sorted(stale):
        r, v, median = stale[cid][0]
        rounds = [x[0] for x in stale[cid]]
        flags.append(
            Flag(
                cid,
                "stale uploads",
                f"{len(rounds)} round(s) ({_round_list(rounds)}) with an update norm below "
                f"{s.stale_ratio:g} × "
                f"the round's median; round {r}: {v:.3g} vs {median:.3g}",
            )
        )
    return flags


def _starved_class_flags(audit: Audit, s: AuditSettings, uniform: float) -> list[Flag]:
    """A class held (by the round-0 descriptions) by one client only, whose weight is under
    ``starved_weight`` × 1/N: one flag per such client, naming its classes."""
    held = audit.described > 0
    flags = []
    for i in range(audit.num_clients):
        alone = [k for k in range(held.shape[1]) if held[i, k] and held[:, k].sum() == 1]
        w = float(audit.weights[i])
        if alone and w < s.starved_weight * uniform:
            classes = ", ".join(
                f"class {audit.names.class_name(k)} ({int(audit.described[i, k])} samples)" for k in alone
            )
            flags.append(
                Flag(
                    i,
                    "starved class",
                    f"the only client holding {classes} has weight {w:.3g} < {s.starved_weight:g} × 1/N: "
                    "the global model may not learn " + ("it" if len(alone) == 1 else "them"),
                )
            )
    return flags


def _low_weight_flags(audit: Audit, s: AuditSettings, uniform: float) -> list[Flag]:
    """**low weight**: clients whose final weight is under ``low_weight`` × 1/N, with the reasons found; for
    a method without class evidence, only a weight that low in ``persistent`` of the rounds. The method's
    view, stated as the method's: no claim about the client's marginal value (:func:`_low_value_flags`), nor
    an accusation (a client whose updates carried no information is a free-rider suspect instead:
    :func:`sends_no_information`)."""
    w, shares = audit.weights, audit.class_shares
    flags = []
    for i in range(audit.num_clients):
        if not (w[i] < s.low_weight * uniform):
            continue
        weight = f"weight {w[i]:.3f} = {w[i] / uniform:.2f} × 1/N"
        reasons, lasting = [], True
        if shares is not None:
            covered = int(np.sum(shares[i] >= 0.5 * uniform))
            if covered < shares.shape[1] / 2:
                reasons.append(f"evidence on {covered} of {shares.shape[1]} classes (share ≥ 1/(2N))")
        elif audit.history:  # without evidence, a weight that low in most rounds, not a last-round dip
            low = sum(1 for _, h in audit.history if h[i] < s.low_weight * uniform)
            lasting = low >= s.persistent * len(audit.history)
            reasons.append(f"below {s.low_weight:g} × 1/N in {low} of {len(audit.history)} rounds")
        if lasting:
            flags.append(Flag(i, "low weight", "; ".join([f"{audit.method}'s view: {weight}", *reasons])))
    return flags


def _low_value_flags(audit: Audit, s: AuditSettings) -> list[Flag]:
    """**low marginal value**: clients whose standalone accuracy gains little over chance (1/K, K the classes
    the clients described; 0 where the run does not say) against the clients' mean gain: under
    ``low_value`` × that mean. Nothing where the run recorded no standalone accuracies, or the mean gain is
    not positive (no client learns: nothing to compare with)."""
    acc = audit.standalone
    if acc is None or acc.size != audit.num_clients or not np.any(np.isfinite(acc)):
        return []
    k = audit.described.shape[1] if audit.described is not None else len(audit.names.classes)
    chance = 1.0 / k if k else 0.0
    gain = acc - chance
    mean = float(np.nanmean(gain))
    if not mean > 0:
        return []
    baseline = f"chance 1/{k}" if k else "0 (the run names no classes)"
    return [
        Flag(
            i,
            "low marginal value",
            f"its data alone learns little: standalone accuracy {acc[i]:.3f}, a gain over {baseline} of "
            f"{gain[i] / mean:.2f} × the clients' mean (< {s.low_value:g}); its {audit.weight_source} "
            f"{audit.weights[i]:.3f}",
        )
        for i in range(audit.num_clients)
        if np.isfinite(gain[i]) and gain[i] < s.low_value * mean
    ]


def _round_list(rounds: list[int], shown: int = 6) -> str:
    text = ", ".join(str(r) for r in rounds[:shown])
    return text + (f", … {rounds[-1]}" if len(rounds) > shown else "")


# --------------------------------------------------------------------------------------------------------
# Ground truth (validation only: what the split and the injected faults know)
# --------------------------------------------------------------------------------------------------------
def ground_truth(run_dir: Path, s: AuditSettings | None = None) -> dict[str, list[int]]:
    """The clients each flag should name, from the simulation's own records: the holders of
    ≥ ``dominant_share`` of a class's samples (partition.json), the injected faults ([faults]). A
    free-rider suspect is a client that sends no information (the ``free-rider``, ``stale`` and ``replay``
    faults); the ``free-rider`` split's client trains on its few samples and sends that update, so it is no
    free-rider truth here: its finding, if any, is low marginal value, judged against exact Shapley."""
    s = s or AuditSettings()
    # "low marginal value" and "low weight" have no truth here (NO_RUN_TRUTH): the first needs every
    # coalition's value (fedhet shapley; the contribution-estimators study judges it against exact Shapley)
    truth: dict[str, list[int]] = {kind: [] for kind in FLAGS if kind not in NO_RUN_TRUTH}
    part = json.loads((run_dir / PARTITION_FILE).read_text())
    counts = np.asarray(part["counts"], dtype=np.float64)
    totals = counts.sum(axis=0)
    dominant = (counts >= s.dominant_share * np.where(totals > 0, totals, np.inf)).any(axis=1)
    truth["maverick"] = [int(i) for i in np.flatnonzero(dominant)]
    # a class's only holder by the partition, starved by the run's final weights (the split's truth about who
    # holds what; the weights are the method's own doing)
    summary = read_summary(run_dir)
    weights = summary.get("contributions")
    sole = [
        int(i)
        for i in range(len(counts))
        if any(counts[i, k] > 0 and (counts[:, k] > 0).sum() == 1 for k in range(counts.shape[1]))
    ]
    if weights is not None:
        truth["starved class"] = [i for i in sole if weights[i] < s.starved_weight / len(counts)]
    config = tomllib.loads((run_dir / CONFIG_FILE).read_text())
    guards = load_run_config(run_dir / CONFIG_FILE).guards  # as the run ran (defaults it did not set)
    refused = {"nan"}  # non-finite updates are always refused; the others only by the guards that catch them
    if guards.update_norm_factor:
        refused |= {"noise", "scale"}
    if guards.num_examples_factor or guards.max_num_examples is not None:
        refused.add("lie-num-examples")
    # updates longer than the clip's bound that pass the rejecting guard: scaled under its bound on purpose
    clipped = {"adaptive-scale", "noise", "scale"} if guards.update_norm_clip else set()
    for cid, behaviour in config.get("faults", {}).get("clients", {}).items():
        if behaviour in refused:
            truth["rejected updates"].append(int(cid))
        elif behaviour in clipped:
            truth["clipped updates"].append(int(cid))
        kinds = {
            "stale": ("stale uploads", "free-rider suspect"),  # sends back the model it was sent
            "crash": ("failed rounds",),
            "drop": ("failed rounds",),
            "free-rider": ("free-rider suspect",),  # the disguised free rider: the model it was sent + noise
            "replay": ("free-rider suspect",),  # its first update, every round
        }.get(behaviour, ())
        for kind in kinds:
            truth[kind].append(int(cid))
    # a free rider the guards refused in every round (noise far longer than the honest updates) never reached
    # the aggregate: what the audit should name is its rejected updates, not a free rider it never saw train
    refused_always = _refused_every_round(read_metrics(run_dir, missing_ok=True))
    for cid in [c for c in truth["free-rider suspect"] if c in refused_always]:
        truth["free-rider suspect"].remove(cid)
        if cid not in truth["rejected updates"]:
            truth["rejected updates"].append(cid)
    return truth


def _refused_every_round(lines: Sequence[dict[str, Any]]) -> set[int]:
    """The clients rejected in every round they replied in (and in at least one)."""
    rejected: set[int] = set()
    kept: set[int] = set()
    for ln in lines:
        rejected |= {int(c) for c in ln.get("rejected") or {}}
        kept |= {int(c) for c in ln.get("clients") or []}
    return rejected - kept


def tally_flag(
    counts: dict[tuple[str, str], dict[str, int]], kind: str, method: str, flagged: set[int], true: set[int]
) -> None:
    """Add one run's clients of one flag to ``counts`` under (kind, "all") and (kind, method): true and false
    positives and misses (``tp``, ``fp``, ``fn``)."""
    for key in ((kind, "all"), (kind, method)):
        c = counts.setdefault(key, {"tp": 0, "fp": 0, "fn": 0})
        c["tp"] += len(flagged & true)
        c["fp"] += len(flagged - true)
        c["fn"] += len(true - flagged)


def flag_table(counts: dict[tuple[str, str], dict[str, int]], kinds: Sequence[str]) -> list[str]:
    """The Markdown table of :func:`tally_flag`'s counts, flag by flag in ``kinds`` order, "all" first:
    precision tp / (tp + fp) and recall tp / (tp + fn), or why there is none."""
    lines = [
        "| flag | method | true positives | false positives | missed | precision | recall |",
        "|---|---|---|---|---|---|---|",
    ]
    for (kind, method), c in sorted(
        counts.items(), key=lambda kv: (kinds.index(kv[0][0]), kv[0][1] != "all", kv[0][1])
    ):
        flagged, true = c["tp"] + c["fp"], c["tp"] + c["fn"]
        precision = f"{100 * c['tp'] / flagged:.0f} %" if flagged else "— (nothing flagged)"
        recall = f"{100 * c['tp'] / true:.0f} %" if true else "— (no true case)"
        lines.append(f"| {kind} | {method} | {c['tp']} | {c['fp']} | {c['fn']} | {precision} | {recall} |")
    return lines


# --------------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------------
def audit_markdown(audits: Sequence[Audit], fig_dir: Path, rel: str) -> str:
    """The audit page: per run, the client table, the flags with their evidence, and three figures."""
    parts = [
        "# Contribution audit",
        "",
        "Read from what each run recorded and the server could know (weights, self-described sample counts, "
        "CELM's class evidence, update norms, rejected updates); the split's ground truth is not used. "
        "Flags and thresholds: `fedhet audit --help`, docs/audit.md.",
        "",
    ]
    for index, a in enumerate(audits):
        name = f"{a.method}, seed {a.seed}"
        slug = f"{index:02d}-{run_name(a.method, a.seed)}"
        parts += [f"## {name}", "", f"Run directory: `{a.run_dir}`", ""]
        header = ["client", a.weight_source, "rank"]
        if a.sample_share is not None:
            header += ["sample share", "weight / sample share"]
        if a.class_shares is not None:
            header += ["classes with evidence", "largest class share"]
        header.append("flags")
        parts += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        ranks = a.ranks()
        for i in range(a.num_clients):
            row = [a.names.client(i), f"{a.weights[i]:.4f}", str(ranks[i])]
            if a.sample_share is not None:
                ratio = a.weights[i] / a.sample_share[i] if a.sample_share[i] > 0 else math.inf
                row += [f"{a.sample_share[i]:.4f}", f"{ratio:.2f}"]
            if a.class_shares is not None:
                sh = a.class_shares[i]
                covered = int(np.sum(sh >= 0.5 / a.num_clients))
                k = int(np.argmax(sh))
                row += [f"{covered} / {sh.size}", f"{100 * sh[k]:.0f} % (class {a.names.class_name(k)})"]
            row.append(", ".join(sorted({f.kind for f in a.flags if f.client == i})) or "—")
            parts.append("| " + " | ".join(row) + " |")
        parts += ["", "Flags:", ""]
        parts += [f"- client {a.names.client(f.client)}, **{f.kind}**: {f.evidence}" for f in a.flags] or [
            "- none"
        ]
        parts.append("")
        for caption, drawn in _audit_figures(a, fig_dir, slug):
            if drawn:
                parts += [f"![{caption}]({rel}/{drawn.name})", ""]
    return "\n".join(parts) + "\n"


def _audit_figures(a: Audit, fig_dir: Path, slug: str) -> list[tuple[str, Path | None]]:
    flagged = {kind: a.flagged(kind) for kind in FLAGS}
    roles = {"free_rider": flagged["free-rider suspect"], "maverick": flagged["maverick"]}
    out: list[tuple[str, Path | None]] = []
    path = fig_dir / f"{slug}-weights.png"
    title = f"{a.method}: {a.weight_source}s over rounds (flags coloured)"
    drawn = F.plot_contribution_history(
        a.history, 0, roles, path, title=title, ylabel=a.weight_source, names=a.names
    )
    out.append(("weights over rounds", path if drawn else None))
    if a.evidence_rounds:
        path = fig_dir / f"{slug}-evidence.png"
        out.append(
            (
                "evidence heatmap",
                path if F.plot_evidence_heatmap(a.evidence_rounds[-1], roles, path, a.names) else None,
            )
        )
    if a.sample_share is not None:
        path = fig_dir / f"{slug}-share.png"
        out.append(("weight against sample share", path if plot_weight_vs_share(a, roles, path) else None))
    return out


def plot_weight_vs_share(a: Audit, roles: dict[str, list[int]], path: Path) -> bool:
    """Each client's final weight against its self-described sample share, with the line weight = share."""
    fig = F.new_figure(5.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    top = float(max(np.nanmax(a.weights), np.nanmax(a.sample_share))) * 1.1
    ax.plot([0, top], [0, top], color="0.6", ls="--", lw=0.8, label="weight = sample share")
    for i in range(a.num_clients):
        role = "free_rider" if i in roles["free_rider"] else "maverick" if i in roles["maverick"] else "other"
        ax.scatter(a.sample_share[i], a.weights[i], color=F.ROLE_COLORS[role], s=30)
        ax.annotate(
            a.names.client(i),
            (a.sample_share[i], a.weights[i]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.set_xlabel("sample share (self-described)")
    ax.set_ylabel(f"final {a.weight_source}")
    ax.set_title(
        f"{a.method}: weight against sample share (flagged: red free-rider suspect, orange maverick)",
        fontsize=8,
    )
    ax.legend(fontsize=7)
    F.save_figure(fig, path)
    return True


def write_audit(
    paths: Sequence[Path], out: Path, settings: AuditSettings | None = None
) -> tuple[Path, list[Audit]]:
    """Audit every run under ``paths``; write ``out`` (Markdown) with its figures beside it."""
    runs = find_runs(list(paths))
    audits = []
    skipped = []
    for run in runs:
        try:
            audits.append(load_audit(run, settings))
        except ConfigError as exc:
            skipped.append(f"- `{run}`: {exc}")
    if not audits:
        raise ConfigError("nothing to audit:\n" + "\n".join(skipped))
    fig_dir = out.parent / f"{out.stem}_figures"
    text = audit_markdown(audits, fig_dir, fig_dir.name)
    if skipped:
        text += "\n## Runs not audited\n\n" + "\n".join(skipped) + "\n"
    out.write_text(text)
    return out, audits
