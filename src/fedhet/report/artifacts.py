"""A run directory's CSVs and method figures, built from its records alone.

``write_run_artifacts(run_dir)`` reads ``metrics.jsonl``, ``summary.json``, ``partition.json``,
``config.toml`` and ``records.json`` (the strategy's :meth:`~fedhet.engine.protocol.Strategy.run_records`)
and writes what each section of the records calls for:

- ``celm``: ``contributions.csv`` (a row per round and client), ``evidence/round_NNN_{raw,debiased}.csv``
  and three figures;
- ``submodel`` (FedRAC, FedSAC): ``clients.csv``, ``unit_frequency.csv``, ``fairness_summary.json`` and four
  figures;
- ``client_table`` (CFFL, CGSV, ShapFed, IAFL): one row per client, ``<method>_clients.csv``;
- ``fssl`` (the semi-supervised methods): ``fssl_rounds.csv``, the pseudo-label figure and, for ProxyFL,
  ``global_prior.csv`` with its figure.

Written at the end of every run by the RunArtifacts listener (report/listeners.py) that fedhet.run and
the CLI pass to the round loop; it can be rerun on any finished run directory.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.engine.names import RunNames
from fedhet.engine.rundir import (
    CONFIG_FILE,
    PARTITION_FILE,
    RECORDS_FILE,
    is_finished,
    read_metrics,
    read_summary,
)
from fedhet.report import figures as F
from fedhet.report.fairness import fairness_summary

#: metrics.jsonl keys that belong in fssl_rounds.csv (pooled pseudo-label statistics, mean client losses,
#: ProxyFL's proxy tuning, FedProto's prototype count).
FSSL_ROUND_PREFIXES = ("pseudo_label_", "unlabeled_used_", "loss_", "gpt_", "prototype_")
#: The pseudo-label series of the FSSL figure.
PSEUDO_LABEL_KEYS = ("pseudo_label_accuracy", "pseudo_label_accuracy_used", "unlabeled_used_fraction")


def class_columns(names: RunNames, num_classes: int) -> list[str]:
    """A CSV column per class, named as the data name the classes (``class_<k>`` where the run recorded no
    names, or another number of them): one naming for every per-class output."""
    if len(names.classes) == num_classes:
        return [str(c) for c in names.classes]
    return [f"class_{k}" for k in range(num_classes)]


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def write_run_artifacts(run_dir: str | Path) -> None:
    """Write every artifact the run's records call for into ``run_dir`` (figures under ``figures/``)."""
    run = Path(run_dir)
    records = _json(run / RECORDS_FILE) or {}
    if not records:
        return
    lines = read_metrics(run, missing_ok=True)
    summary = (read_summary(run) if is_finished(run) else None) or {}
    partition = _json(run / PARTITION_FILE) or {}
    names = RunNames.of_summary(summary, partition.get("classes"))
    if "celm" in records:
        write_celm(run, records["celm"], lines, summary, partition.get("info") or {}, names)
    if "submodel" in records:
        write_submodel(run, records["submodel"], lines, summary, names)
    if "client_table" in records:
        write_client_table(run, records["client_table"], names)
    if "fssl" in records:
        write_fssl(run, records["fssl"], lines, names)


def _cells(values: Any) -> list[str]:
    return ["" if v is None or not math.isfinite(v) else f"{v:.8g}" for v in values]


def float_array(values: Any) -> np.ndarray:
    """A float array from JSON lists, None (a NaN written by the engine) back to NaN; arrays pass through."""
    if isinstance(values, np.ndarray):
        return values.astype(np.float64, copy=False)
    return np.array(
        [[math.nan if v is None else v for v in row] for row in values]
        if values and isinstance(values[0], list)
        else [math.nan if v is None else v for v in values],
        dtype=np.float64,
    )


# --------------------------------------------------------------------------------------------------------
# CELM
# --------------------------------------------------------------------------------------------------------
def roles(info: dict[str, Any]) -> dict[str, list[int]]:
    """Clients with a known role in the split (partition info): ``free_rider`` and ``maverick``."""
    free = info.get("free_rider")
    return {
        "free_rider": [int(free)] if free is not None else [],
        "maverick": [int(c) for c in info.get("maverick_clients", []) or []],
    }


def celm_evidence(record: dict[str, Any]) -> list[dict[str, Any]]:
    """CELM's per-warm-up-round evidence from ``records.json["celm"]`` as float arrays (null -> NaN)."""
    return [
        {k: (v if k == "round" else float_array(v)) for k, v in e.items()} for e in record.get("evidence", [])
    ]


def write_celm(
    run: Path,
    record: dict[str, Any],
    lines: list[dict],
    summary: dict,
    info: dict[str, Any],
    names: RunNames | None = None,
) -> None:
    """contributions.csv (a row per round and client: c_i, its ``site`` last), the evidence CSVs of every
    warm-up round (a row per client, its ``site`` last), and three figures."""
    names = names or RunNames()
    history = [(ln["round"], ln["contributions"]) for ln in lines if ln.get("contributions")]
    with open(run / "contributions.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["round", "phase", "client", "contribution", "site"])
        phases = {ln["round"]: ln.get("celm_phase", "") for ln in lines}
        for rnd, c in history:
            for i, v in enumerate(c):
                w.writerow([rnd, phases.get(rnd, ""), i, f"{v:.10g}", names.site(i)])
    evidence = celm_evidence(record)
    ev_dir = run / "evidence"
    ev_dir.mkdir(exist_ok=True)
    for e in evidence:
        header = ["model", *class_columns(names, e["raw"].shape[1])]
        t = e["round"]
        with open(ev_dir / f"round_{t:03d}_raw.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(header + ["site"])
            w.writerow(["global_previous"] + [f"{v:.8g}" for v in e["global"]] + [""])
            for i in range(e["raw"].shape[0]):
                w.writerow([f"client_{i}"] + _cells(e["raw"][i]) + [names.site(i)])
        with open(ev_dir / f"round_{t:03d}_debiased.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(header + ["score", "site"])
            w.writerow(["baseline"] + [f"{v:.8g}" for v in e["baseline"]] + ["", ""])
            for i in range(e["debiased"].shape[0]):
                scores = _cells(e["scores"][i : i + 1])
                w.writerow([f"client_{i}"] + _cells(e["debiased"][i]) + scores + [names.site(i)])
    role = roles(info)
    fig_dir = run / "figures"
    F.plot_contribution_history(
        history, int(record.get("warmup_rounds", 0)), role, fig_dir / "celm_contributions.png", names=names
    )
    if evidence:
        F.plot_evidence_heatmap(evidence[-1], role, fig_dir / "celm_evidence.png", names)
    if summary.get("contributions"):
        weights = np.asarray(summary["contributions"])
        F.plot_final_weights(weights, role, fig_dir / "celm_final_weights.png", names)


# --------------------------------------------------------------------------------------------------------
# Submodels (FedRAC, FedSAC)
# --------------------------------------------------------------------------------------------------------
def _bcf_alpha(run: Path) -> float:
    path = run / CONFIG_FILE
    if path.is_file():
        from fedhet.config import load_config

        return float(load_config(path).eval.bcf_alpha)
    return 0.5


def write_submodel(
    run: Path, record: dict[str, Any], lines: list[dict], summary: dict, names: RunNames | None = None
) -> None:
    """clients.csv (a row per client, its ``site`` last), unit_frequency.csv, fairness_summary.json and four
    figures (see docs/fedrac.md)."""
    names = names or RunNames()
    # The reputation the method allocated by: the standalone accuracies (the paper), or relative evidence
    # (data-free FedRAC); runs before the data-free option recorded it as "standalone".
    reputation = np.asarray(record.get("reputation", record.get("standalone")), dtype=np.float64)
    sharpened = np.asarray(record["sharpened"], dtype=np.float64)
    sizes = record["mask_sizes"]
    n = len(reputation)
    # The evaluation's standalone accuracies (the fairness reference), which a data-free method never saw.
    # Without it (eval.fairness = false) the figures plot against the reputation instead.
    standalone = np.asarray(summary.get("standalone") or reputation, dtype=np.float64)
    rewards = summary.get("rewards") or [math.nan] * n
    with open(run / "clients.csv", "w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(
            ["client", "standalone", "reputation", "sharpened_contribution", "mask_size", "reward", "site"]
        )
        for cid in range(n):
            reward = rewards[cid] if rewards[cid] is not None else math.nan
            values = (standalone[cid], reputation[cid], sharpened[cid])
            writer.writerow(
                [cid, *(f"{v:.6f}" for v in values), sizes[cid], f"{reward:.6f}", names.site(cid)]
            )
    snapshots = {int(r): np.asarray(v) for r, v in record["frequency_snapshots"].items()}
    freq_rows = ["round," + ",".join(f"unit_{u}" for u in range(record["units"]))]
    for r in sorted(snapshots):
        freq_rows.append(f"{r}," + ",".join(str(int(v)) for v in snapshots[r].tolist()))
    (run / "unit_frequency.csv").write_text("\n".join(freq_rows) + "\n")
    report = fairness_summary(lines, rounds=summary.get("rounds"))
    report["candidate_eval_seconds_mean"] = record.get("candidate_eval_seconds_mean")
    (run / "fairness_summary.json").write_text(json.dumps(report, indent=2))
    figures = run / "figures"
    title = record["label"]
    F.plot_rewards_scatter(
        standalone, rewards, _bcf_alpha(run), figures / "rewards_vs_standalone.png", title, names
    )
    F.plot_unit_frequency(
        snapshots, n, figures / "unit_frequency.png", title, split=record.get("layer_sizes", [])
    )
    F.plot_fairness_rounds(lines, report, figures / "fairness_rate.png", title)
    F.plot_mask_sizes(lines, standalone, figures / "mask_sizes.png", title)


# --------------------------------------------------------------------------------------------------------
# Own-model methods: the per-client table
# --------------------------------------------------------------------------------------------------------
def write_client_table(run: Path, record: dict[str, Any], names: RunNames | None = None) -> None:
    """``<method>_clients.csv``: one row per client, one column per recorded per-client value, its ``site``
    last ("" where the data name no sites)."""
    names = names or RunNames()
    cols: dict[str, list[Any]] = record["columns"]
    count = len(next(iter(cols.values()))) if cols else 0
    with open(run / record["file"], "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["client", *cols, "site"])
        for cid in range(count):
            writer.writerow([cid, *(cols[c][cid] for c in cols), names.site(cid)])


# --------------------------------------------------------------------------------------------------------
# Semi-supervised methods
# --------------------------------------------------------------------------------------------------------
def write_fssl(run: Path, record: dict[str, Any], lines: list[dict], names: RunNames | None = None) -> None:
    """``fssl_rounds.csv`` and the pseudo-label figure; ``global_prior.csv`` and its figure for ProxyFL."""
    keys = sorted(
        {
            k
            for ln in lines
            for k, v in ln.items()
            if k.startswith(FSSL_ROUND_PREFIXES) and isinstance(v, int | float)
        }
    )
    with open(run / "fssl_rounds.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["round", *keys])
        for ln in lines:
            writer.writerow([ln["round"], *[ln.get(k, "") for k in keys]])
    method = record.get("method", "fssl")
    series = {
        k: [(ln["round"], ln[k]) for ln in lines if isinstance(ln.get(k), int | float)]
        for k in PSEUDO_LABEL_KEYS
    }
    F.plot_round_series(
        series,
        run / "figures" / "pseudo_labels.png",
        title=f"{method}: pseudo-labels on the clients' unlabeled data",
        ylabel="fraction",
    )
    priors = [(ln["round"], ln["global_prior"]) for ln in lines if ln.get("global_prior")]
    if not priors:
        return
    num_classes = len(priors[0][1])
    priors = [(0, [1.0 / num_classes] * num_classes), *priors]
    with open(run / "global_prior.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["round", *class_columns(names or RunNames(), num_classes)])
        for rnd, prior in priors:
            writer.writerow([rnd, *prior])
    prior_series = {
        f"class {names.class_name(k)}": [(rnd, prior[k]) for rnd, prior in priors] for k in range(num_classes)
    }
    F.plot_round_series(
        prior_series, run / "figures" / "global_prior.png", "ProxyFL: global class prior", "P(c)"
    )
