"""The robustness table (``fedhet robustness``; docs/results/robustness.md): hostile clients against every
defence and contribution method.

``run`` makes, on the shipped experiment robustness/fmnist-n10 (Fashion-MNIST, 10 clients, Dir(0.5)), one
compare cell per row and column: the rows are the clean run and every injected behaviour of ``[faults]``
(:data:`ATTACKS`) acted by f = 1 (client 0) or f = 3 (clients 0, 1, 2, colluding) of the
10 clients; the columns are FedAvg as published (no guard), FedAvg with fedhet's default defences, FedAvg with
each robust aggregation rule on top of the defaults, and CELM, CGSV, ShapFed and FedRAC with the defaults.
Runs do not stop when every update is rejected (``guards.max_all_rejected_rounds = 0``): a collapsed model is
a result here. ``table`` gives, per row and column, the hostile clients' total weight (the contribution
estimate where the method makes one, the mean share of the rounds' averages for the FedAvg columns, the mean
reward accuracy of the hostile clients for FedRAC) and the final accuracy against the clean run (mean over
seeds), then checks the defaults against their targets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.engine.rundir import finished_runs, is_finished, read_summary, run_name
from fedhet.studies.base import CompareCell, RunLog, Study, recorded_runs, write_cell_records

CONFIG = "robustness/fmnist-n10"
CLIENTS = 10
#: f -> the hostile clients (colluding: same behaviour, shared statistics for the coordinated attacks)
HOSTILE = {1: (0,), 3: (0, 1, 2)}
#: no guard at all: the methods as their papers publish them
UNDEFENDED = {"guards.update_norm_factor": 0, "guards.num_examples_factor": 0, "guards.update_norm_clip": 0}
#: the defaults without the clipping guard: what clipping adds to the rejecting guards
NO_CLIPPING = {"guards.update_norm_clip": 0}
#: the defaults with a looser clip: what the clipping factor trades (honest updates clipped against the
#: attacks' reach); measured for FedAvg and CELM
LOOSER_CLIP = {"guards.update_norm_clip": 3.0}
#: Behaviour parameters beyond the [faults] defaults: a free rider hides its idleness under tiny noise (a
#: std of 1 would be the noise attack again).
BEHAVIOUR_SETTINGS: dict[str, dict[str, Any]] = {"free-rider": {"faults.noise_std": 1e-3}}


def _rules(f: int) -> dict[str, dict[str, Any]]:
    """The robust aggregation rules on top of the defaults, set for f hostile clients of 10."""
    return {
        "median": {"aggregation.rule": "median"},
        "trimmed-mean": {"aggregation.rule": "trimmed-mean", "aggregation.beta": 0.3},
        "krum": {"aggregation.rule": "krum", "aggregation.num_malicious_nodes": f},
        "multi-krum": {
            "aggregation.rule": "multi-krum",
            "aggregation.num_malicious_nodes": f,
            "aggregation.num_nodes_to_select": CLIENTS - f,
        },
        "centered-clipping": {"aggregation.rule": "centered-clipping", "aggregation.clipping_tau": 1.0},
        # the defences built for heterogeneous data: the geometric median (RFA), and the pre-aggregation
        # steps, each before the rule its paper pairs it with (NNM and ARC before the trimmed mean above,
        # bucketing before centered clipping, Karimireddy et al.'s strongest pair)
        "geometric-median": {"aggregation.rule": "geometric-median"},
        "nnm-trimmed-mean": {
            "aggregation.pre": ["nnm"],
            "aggregation.num_malicious_nodes": f,
            "aggregation.rule": "trimmed-mean",
            "aggregation.beta": 0.3,
        },
        "bucketing-centered-clipping": {
            "aggregation.pre": ["bucketing"],
            "aggregation.bucket_size": 2,
            "aggregation.rule": "centered-clipping",
            "aggregation.clipping_tau": 1.0,
        },
        "arc-trimmed-mean": {
            "aggregation.pre": ["arc"],
            "aggregation.num_malicious_nodes": f,
            "aggregation.rule": "trimmed-mean",
            "aggregation.beta": 0.3,
        },
    }


#: rule -> its column's name where it is not the rule's own (a pre-aggregation step, then the rule)
RULE_COLUMNS = {
    "nnm-trimmed-mean": "nnm + trimmed-mean",
    "bucketing-centered-clipping": "bucketing + centered-clipping",
    "arc-trimmed-mean": "arc + trimmed-mean",
}
#: rule -> the column of the same rule computed by Flower's own strategy (the anchor)
FLOWER_COLUMNS = {"median": "Flower FedMedian", "trimmed-mean": "Flower FedTrimmedAvg", "krum": "Flower Krum"}


def _flower_rules(f: int) -> dict[str, dict[str, Any]]:
    """The rules of :data:`FLOWER_COLUMNS`, set as :func:`_rules` sets them, computed by Flower's own
    strategies (``aggregation.implementation = "flower"``)."""
    rules = _rules(f)
    return {
        f"flower-{rule}": {**rules[rule], "aggregation.implementation": "flower"} for rule in FLOWER_COLUMNS
    }


#: table column -> (variant, method); a variant is a cell of each row
COLUMNS: dict[str, tuple[str, str]] = {
    "FedAvg": ("undefended", "fedavg"),
    "FedAvg, defaults": ("defaults", "fedavg"),
    "FedAvg, defaults without clipping": ("no-clipping", "fedavg"),
    "FedAvg, clip 3×": ("clip-3", "fedavg"),
    **{f"+ {RULE_COLUMNS.get(rule, rule)}": (rule, "fedavg") for rule in _rules(1)},
    **{column: (f"flower-{rule}", "fedavg") for rule, column in FLOWER_COLUMNS.items()},
    "CELM": ("defaults", "celm"),
    "CELM, paper's evidence": ("paper-evidence", "celm"),
    "CELM, paper's evidence, clip 3×": ("clip-3", "celm"),
    "CGSV": ("defaults", "cgsv"),
    "ShapFed": ("defaults", "shapfed"),
    "FedRAC": ("defaults", "fedrac"),
}
DEFAULTS_METHODS = ("fedavg", "celm", "cgsv", "shapfed", "fedrac")
#: CELM's evidence as the paper computes it (``evidence_clip = 0``): CELM's default until this page measured
#: the clip (evidence from updates clipped to the round's median length, ``evidence_clip = 1``, now the
#: default) against the adaptive-scale attacker; its cells were the default column's then.
PAPER_EVIDENCE = {"celm": {"evidence_clip": 0}}
#: the variants checked against the targets of the defaults: the defaults, and the candidate defences
TARGETED = ("defaults", "clip-3", "paper-evidence")
#: The attacks of the table's first rows: the built-in attacks of fedhet.attacks when the table was made.
FIRST_ATTACKS = (
    "noise", "scale", "sign-flip", "stale", "nan", "lie-num-examples", "crash", "drop",
    "label-flip", "free-rider", "replay", "alie", "ipm", "adaptive-scale",
)  # fmt: skip
#: The attacks built to beat robust rules, rows added since (min-max and min-sum with their default
#: direction, mimic, inf): adding a row adds cells to run and leaves every record valid.
ADAPTIVE_ATTACKS = ("min-max", "min-sum", "mimic", "inf")
ATTACKS = FIRST_ATTACKS + ADAPTIVE_ATTACKS


def _rows(attacks: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """The clean run once, then (behaviour, f) for every attack at f = 1, then at f = 3."""
    return (("clean", 0),) + tuple((behaviour, f) for f in HOSTILE for behaviour in attacks)


#: the rows: (behaviour, f); the clean run once
ROWS = _rows(ATTACKS)
#: the rows the table began with (the clean run and FIRST_ATTACKS)
FIRST_ROWS = _rows(FIRST_ATTACKS)
#: variant -> the only rows it is measured on (a variant not named here has a cell in every row); the page
#: shows the other rows' cells as "–" and says so. The anchors (Flower's strategies, the same numbers as
#: fedhet's rules) and the looser clip (an ablation of the guards) keep the first rows only: the added
#: attacks are measured against every candidate default and every contribution method.
VARIANT_ROWS: dict[str, tuple[tuple[str, int], ...]] = {
    variant: FIRST_ROWS for variant in ("clip-3", *(f"flower-{rule}" for rule in FLOWER_COLUMNS))
}
#: targets of the defaults (docs/results/robustness.md): the largest accuracy drop allowed, by f
TARGET_DROP = {1: 2.0, 3: 5.0}


def row_name(behaviour: str, f: int) -> str:
    return "clean" if behaviour == "clean" else f"{behaviour}/f{f}"


def _variants(f: int) -> dict[str, tuple[tuple[str, ...], dict[str, Any]]]:
    return {
        "undefended": (("fedavg",), UNDEFENDED),
        "defaults": (DEFAULTS_METHODS, {}),
        "no-clipping": (("fedavg",), NO_CLIPPING),
        "clip-3": (("fedavg", "celm"), LOOSER_CLIP),
        **{rule: (("fedavg",), sets) for rule, sets in _rules(max(f, 1)).items()},
        **{rule: (("fedavg",), sets) for rule, sets in _flower_rules(max(f, 1)).items()},
        "paper-evidence": (("celm",), {}),
    }


#: variant -> the parameters of some of its methods (CELM's evidence as the paper computes it)
VARIANT_PARAMS: dict[str, dict[str, dict[str, Any]]] = {
    "paper-evidence": PAPER_EVIDENCE,
    "clip-3": PAPER_EVIDENCE,
}


def measured(variant: str, behaviour: str, f: int) -> bool:
    """Whether the variant has a cell in the row (:data:`VARIANT_ROWS`)."""
    return (behaviour, f) in VARIANT_ROWS.get(variant, ((behaviour, f),))


def column_rows(column: str) -> tuple[tuple[str, int], ...]:
    """The rows the column is measured on: every row, or its variant's :data:`VARIANT_ROWS`."""
    return tuple((b, f) for b, f in ROWS if measured(COLUMNS[column][0], b, f))


def cells() -> list[CompareCell]:
    out = []
    for behaviour, f in ROWS:
        fault: dict[str, Any] = {}
        if behaviour != "clean":
            fault = {f"faults.clients.{c}": behaviour for c in HOSTILE[f]}
            fault.update(BEHAVIOUR_SETTINGS.get(behaviour, {}))
        for variant, (methods, overrides) in _variants(f).items():
            if not measured(variant, behaviour, f):
                continue
            sets = {"guards.max_all_rejected_rounds": 0, **fault, **overrides}
            params = VARIANT_PARAMS.get(variant, {})
            out.append(CompareCell(f"{row_name(behaviour, f)}/{variant}", CONFIG, methods, sets, params))
    return out


#: The engine check: these rows' Flower columns, seed 0, run again through Flower's simulation engine (Ray
#: and Flower's Grid between the server and the clients), to show the table's embedded runs are what a
#: Flower federation gets. Few rows: a Flower-engine run costs ~6× an embedded one on 2 cores.
ENGINE_CHECK_ROWS: tuple[tuple[str, int], ...] = (("clean", 0), ("ipm", 3))
ENGINE_CHECK_DIR = "flower-engine"


def engine_check_cells() -> list[tuple[CompareCell, CompareCell]]:
    """(cell, the same cell run through Flower's engine, recorded under :data:`ENGINE_CHECK_DIR`) for every
    engine-check cell; both run FedAvg only."""
    wanted = {f"{row_name(b, f)}/flower-{rule}" for b, f in ENGINE_CHECK_ROWS for rule in FLOWER_COLUMNS}
    return [
        (
            CompareCell(cell.path, cell.config, ("fedavg",), cell.overrides),
            CompareCell(f"{ENGINE_CHECK_DIR}/{cell.path}", cell.config, ("fedavg",), cell.overrides),
        )
        for cell in cells()
        if cell.path in wanted
    ]


def run_engine_check(out: Path, echo: Callable[[str], None], records: Path | None = None) -> None:
    """The engine-check cells through ``--engine flower-simulation`` (finished or recorded ones kept)."""
    from fedhet.api import run

    checks = engine_check_cells()
    for n, (_, flower) in enumerate(checks, 1):
        target = out / flower.path / run_name("fedavg", 0)
        if records is not None and recorded_runs(records, flower, "fedavg"):
            continue
        if not is_finished(target):
            echo(f"[Flower engine {n}/{len(checks)}] {flower.path}, seed 0")
            overrides = {**flower.overrides, "method.name": "fedavg", "seed": 0}
            run(flower.config, overrides=overrides, out=target, overwrite=True, engine="flower-simulation")
        if records is not None:
            write_cell_records(run_values, records, flower, out, [0])


def _seed0_accuracies(cell: CompareCell, out: Path | None, records: Path | None) -> list[float] | None:
    """Every evaluation's accuracy of the cell's FedAvg seed 0: from its run in ``out``, else its record."""
    run = out / cell.path / run_name("fedavg", 0) if out is not None else None
    if run is not None and is_finished(run):
        return RunLog.read(run).accuracies
    found = [r for r in recorded_runs(records, cell, "fedavg") if r["seed"] == 0] if records else []
    return found[0]["values"].get("accuracies") if found else None


def engine_check_lines(out: Path | None, records: Path | None = None) -> list[str]:
    """The engine check as a Markdown table: each cell's accuracy, embedded and on Flower's engine."""
    rows = []
    for cell, flower in engine_check_cells():
        ours, theirs = _seed0_accuracies(cell, out, records), _seed0_accuracies(flower, out, records)
        if not (ours and theirs):
            continue
        same = (
            "identical"
            if ours == theirs
            else (
                f"differ by up to {100 * max(abs(a - b) for a, b in zip(ours, theirs, strict=False)):.2f} pts"
            )
        )
        rows.append(f"| {cell.path} | {100 * ours[-1]:.2f} | {100 * theirs[-1]:.2f} | {same} |")
    if not rows:
        return ["Not run yet (`fedhet robustness run` runs it after the cells)."]
    return [
        "| cell (seed 0) | embedded engine, final accuracy % | Flower simulation engine | every evaluation |",
        "|---|---|---|---|",
        *rows,
    ]


def hostile_weight(run: RunLog, method: str, hostile: tuple[int, ...]) -> float:
    """The hostile clients' total weight in one run (see the module docstring); FedRAC: their mean reward."""
    if method == "fedrac":
        rewards = run.summary["rewards"]
        return float(np.mean([rewards[c] for c in hostile]))
    lines = run.lines
    if method == "fedavg":
        shares = [
            sum(line.get("aggregation_weights", {}).get(str(c), 0.0) for c in hostile) for line in lines
        ]
        return float(np.mean(shares))
    reported = [line["contributions"] for line in lines if line.get("contributions")]
    return float(sum(reported[-1][c] for c in hostile)) if reported else float("nan")


def largest_honest_ratio(run: RunLog, hostile: tuple[int, ...] = ()) -> float:
    """max over the rounds and the honest clients of ‖w_i − w_sent‖ / the round's median norm (the median
    over every update of the round, as the guards take it): how close honest updates come to the guards."""
    ratios = [
        v / median
        for line in run.lines
        if (norms := line.get("update_norms")) and (median := float(np.median(list(norms.values())))) > 0
        for cid, v in norms.items()
        if int(cid) not in hostile
    ]
    return max(ratios, default=float("nan"))


def _honest(run: RunLog, hostile: tuple[int, ...], what: str) -> int:
    """How many updates of honest clients the run ``what`` ("rejected" or "clipped") over all rounds."""
    return sum(1 for line in run.lines for cid in line.get(what, {}) if int(cid) not in hostile)


def _row_of(cell_path: str) -> tuple[str, int]:
    """(behaviour, f) of a cell path ``<row>/<variant>`` (``clean/…``, ``noise/f3/…``), also under a folder
    (the engine check's ``flower-engine/ipm/f3/…``, another setting's ``diabetes-by-age-10/ipm/f3/…``)."""
    parts = cell_path.split("/")
    return ("clean", 0) if parts[-2] == "clean" else (parts[-3], int(parts[-2][1:]))


def run_values(cell: CompareCell, run_dir: Path, method: str) -> dict[str, Any]:
    """What the table reads from one finished run (kept as its record): the final accuracy and every
    evaluation's, the honest updates rejected and clipped, the largest honest norm ratio; attacked: the
    hostile clients' weight and whether one is on top; clean: whether the clients hostile at each f are."""
    behaviour, f = _row_of(cell.path)
    hostile = HOSTILE.get(f, ())
    run = RunLog.read(run_dir)
    acc = run.summary["final"].get("accuracy")
    values: dict[str, Any] = {
        "accuracy": float("nan") if acc is None else float(acc),
        "accuracies": run.accuracies,
        "honest_rejected": _honest(run, hostile, "rejected"),
        "honest_clipped": _honest(run, hostile, "clipped"),
        "honest_ratio": largest_honest_ratio(run, hostile),
    }
    if hostile:
        values["weight"] = hostile_weight(run, method, hostile)
        values["top"] = float(_hostile_on_top(run, method, hostile))
    for g, clients in HOSTILE.items() if not hostile else ():
        values[f"top_f{g}"] = float(_hostile_on_top(run, method, clients))
    return values


#: the per-seed lists of a collected cell (besides "seed", "commit" and "wall_time_s")
VALUES = ("weight", "accuracy", "honest_rejected", "honest_clipped", "honest_ratio", "top")


def collect(out: Path | None, records: Path | None = None) -> dict[tuple[str, str], dict[str, list[Any]]]:
    """(row, column) -> {"weight", "accuracy", "honest_rejected", "honest_clipped", "honest_ratio", "top",
    "seed", "commit", "wall_time_s"} over the seeds found: the runs in ``out``, and for the seeds no run
    there holds, the records in ``records`` of the cell as it is defined now. "top" is 1 where a hostile
    client holds the largest weight (or reward) of the run. The clean row holds, instead, "top_f1" and
    "top_f3": whether the clients that are hostile at that f hold it there (FedAvg's weight is the sample
    count: a client the split made largest is on top with or without an attack)."""
    by_path = {cell.path: cell for cell in cells()}
    found: dict[tuple[str, str], dict[str, list[Any]]] = {}
    for behaviour, f in ROWS:
        for column, (variant, method) in COLUMNS.items():
            cell = by_path.get(f"{row_name(behaviour, f)}/{variant}")  # None: not measured in the row
            # seed -> (values, commit, wall time, machine); a run in ``out`` over its record
            per_seed: dict[int, tuple[dict[str, Any], str, float, str]] = {}
            for record in recorded_runs(records, cell, method) if records and cell else []:
                commits = ", ".join(dict.fromkeys(str(c) for c in record.get("commits") or []))
                wall = float(record.get("wall_time_s") or 0.0)
                per_seed[record["seed"]] = (record["values"], commits, wall, record.get("machine", ""))
            for run in finished_runs(out / cell.path, method) if out is not None and cell else []:
                summary = read_summary(run)
                per_seed[int(run.name.rsplit("seed", 1)[1])] = (
                    run_values(cell, run, method),
                    str(summary.get("fedhet_commit", "unknown")),
                    float(summary.get("wall_time_s") or 0.0),
                    "",
                )
            collected: dict[str, list[Any]] = {
                **{key: [] for key in ("seed", "commit", "wall_time_s", "machine")},
                **{v: [] for v in VALUES},
            }
            for seed in sorted(per_seed):
                values, commit, wall, machine = per_seed[seed]
                collected["seed"].append(seed)
                collected["commit"].append(commit)
                collected["wall_time_s"].append(wall)
                collected["machine"].append(machine)
                for key, value in values.items():
                    if key in VALUES or key.startswith("top_f"):
                        collected.setdefault(key, []).append(value)
            found[row_name(behaviour, f), column] = collected
    return found


def _hostile_on_top(run: RunLog, method: str, hostile: tuple[int, ...]) -> bool:
    """Whether a hostile client holds the largest weight (or reward) of the run."""
    if method == "fedrac":
        values = run.summary["rewards"]
    elif method == "fedavg":
        values = [
            float(np.mean([line.get("aggregation_weights", {}).get(str(c), 0.0) for line in run.lines]))
            for c in range(CLIENTS)
        ]
    else:
        reported = [line["contributions"] for line in run.lines if line.get("contributions")]
        if not reported:
            return False
        values = reported[-1]
    values = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
    others = np.delete(values, [c for c in hostile if c < len(values)])
    return int(np.argmax(values)) in hostile and (not others.size or values.max() > others.max())


def _mean(values: list[float]) -> float:
    return float(np.nanmean(values)) if values else float("nan")


def change_against_clean(cell: Mapping[str, list[float]], clean: Mapping[str, list[float]]) -> float:
    """100 × the mean over the seeds both have of (accuracy − the clean run's accuracy): paired by seed, so a
    row measured at fewer seeds than the clean run is compared with the same seeds' clean runs."""
    clean_by_seed = dict(zip(clean["seed"], clean["accuracy"], strict=True))
    pairs = [
        a - clean_by_seed[s]
        for s, a in zip(cell["seed"], cell["accuracy"], strict=True)
        if s in clean_by_seed
    ]
    return 100 * float(np.nanmean(pairs)) if pairs else float("nan")


def table_lines(found: Mapping[tuple[str, str], Mapping[str, list[float]]]) -> list[str]:
    """The Markdown table, row × column, and the line saying what a cell shows."""
    # a column measured at fewer seeds than the table's most says how many: its means average other seeds
    counts = {c: len(found["clean", c]["accuracy"]) for c in COLUMNS}
    most = max(counts.values(), default=0)
    heads = [
        c if counts[c] in (0, most) else f"{c} ({counts[c]} seed{'s' * (counts[c] > 1)})" for c in COLUMNS
    ]
    rows = ["| hostile clients | " + " | ".join(heads) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for behaviour, f in ROWS:
        name = row_name(behaviour, f)
        cells_ = []
        for column, (_, method) in COLUMNS.items():
            cell, clean = found[name, column], found["clean", column]
            if not cell["accuracy"]:
                cells_.append("–")
                continue
            acc = 100 * _mean(cell["accuracy"])
            if behaviour == "clean":
                cells_.append(f"{acc:.1f}")
                continue
            change = change_against_clean(cell, clean)
            delta = f" ({change:+.1f})" if np.isfinite(change) else ""
            weight = _mean(cell["weight"])
            shown = f"{100 * weight:.0f} %" if method == "fedrac" else f"{weight:.2f}"
            cells_.append(f"{shown} · {acc:.1f}{delta}")
        rows.append(f"| {name} | " + " | ".join(cells_) + " |")
    seeds = sorted({len(v["accuracy"]) for v in found.values() if v["accuracy"]}) or [0]
    seeds_text = f"{seeds[0]} to {seeds[-1]}" if len(seeds) > 1 else str(seeds[0])
    return [
        *rows,
        "",
        "Each cell: the hostile clients' total weight · final accuracy % (change against the clean run of "
        f"the same column, paired by seed), mean of {seeds_text} seeds; FedRAC shows the hostile clients' "
        "mean reward accuracy in place of a weight. A fair share is 0.10 per client (0.30 for f = 3)."
        + "".join(_partial_note(column) for column in COLUMNS),
    ]


def _partial_note(column: str) -> str:
    """The sentence saying which rows a column measured on some rows only covers ("–" in the others)."""
    rows = column_rows(column)
    if len(rows) == len(ROWS):
        return ""
    return f" {column}: measured on the rows {', '.join(row_name(b, f) for b, f in rows)} only (– elsewhere)."


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    found = collect(dirs[0], options.get("records"))
    return "\n".join(
        [
            *table_lines(found),
            "",
            "**Targets of the defaults** (computed from the cells above):",
            "",
            *targets(found),
        ]
    )


def paired_changes(cell: Mapping[str, list[float]], clean: Mapping[str, list[float]]) -> list[float]:
    """The accuracy change against the clean run of the same column, in points, one per seed both hold
    (paired by seed: the same split and initial model), in seed order; a seed whose accuracy is not finite in
    either run has no change."""
    clean_by_seed = dict(zip(clean["seed"], clean["accuracy"], strict=True))
    return [
        100 * (a - clean_by_seed[s])
        for s, a in zip(cell["seed"], cell["accuracy"], strict=True)
        if s in clean_by_seed and np.isfinite(a) and np.isfinite(clean_by_seed[s])
    ]


def drop_verdict(
    cell: Mapping[str, list[float]], clean: Mapping[str, list[float]], target: float
) -> tuple[str, float, float, float]:
    """(verdict, mean, low, high) of the accuracy change against clean (:func:`paired_changes`) with its 95 %
    Student-t interval (:func:`fedhet.verdicts.judge_margin`): "meets" when the interval lies above −target,
    "misses" when it lies below, else "not resolved" (one seed always: no interval)."""
    from fedhet.verdicts import judge_margin

    return judge_margin(paired_changes(cell, clean), target)


def paired_seeds(found: Mapping[tuple[str, str], Mapping[str, list[float]]]) -> str:
    """Over how many seeds the targets' attacked cells are paired with their clean cells ("3 seeds")."""
    counts = {
        len(paired_changes(found[row_name(b, f), column], found["clean", column]))
        for column, (variant, _) in COLUMNS.items()
        if variant in TARGETED
        for b, f in column_rows(column)
        if b != "clean" and found[row_name(b, f), column]["accuracy"]
    }
    return _seeds_text(counts)


def _seeds_text(counts: set[int] | list[int]) -> str:
    """ "3 seeds", "1 to 3 seeds" or "1 seed" for the numbers of seeds of some cells."""
    low, high = min(counts, default=0), max(counts, default=0)
    return f"{low} to {high} seeds" if low != high else f"{low} seed{'s' * (low != 1)}"


def targets(found: Mapping[tuple[str, str], Mapping[str, list[float]]]) -> list[str]:
    """The defaults (and the candidate defences of :data:`TARGETED`) against their targets, one line per
    column, computed from the cells: no attack puts a hostile client on top (where the same clients were not
    on top in the clean run of the same seed); the accuracy change against clean, paired by seed, has its
    95 % Student-t interval above −2 points at f = 1 and −5 points at f = 3 (:func:`drop_verdict`: meets,
    misses, or not resolved); and no honest update is rejected in a clean run. A column measured on some
    rows only (:data:`VARIANT_ROWS`) is judged on those."""
    lines = []
    for column in [c for c, (variant, _) in COLUMNS.items() if variant in TARGETED]:
        attacked = [(b, f) for b, f in column_rows(column) if b != "clean"]
        clean = found["clean", column]
        if not clean["accuracy"]:
            lines.append(f"- **{column}**: not measured yet (no clean run)")
            continue
        misses, unresolved, on_top, seeds, measured = [], [], [], set(), 0
        for behaviour, f in attacked:
            cell = found[row_name(behaviour, f), column]
            if not cell["accuracy"]:
                continue
            measured += 1
            seeds.add(len(paired_changes(cell, clean)))
            verdict, mean, low, high = drop_verdict(cell, clean, TARGET_DROP[f])
            shown = f"{row_name(behaviour, f)} {mean:+.1f} [{low:+.1f}, {high:+.1f}]"
            if verdict == "misses":
                misses.append(shown)
            elif verdict == "not resolved":
                unresolved.append(shown if np.isfinite(low) else f"{row_name(behaviour, f)} (one seed)")
            # on top because of the attack: not where the same clients were on top in the clean run
            clean_top = dict(zip(clean["seed"], clean.get(f"top_f{f}", []), strict=False))
            gained = [s for s, t in zip(cell["seed"], cell["top"], strict=True) if t and not clean_top.get(s)]
            if gained:
                on_top.append(f"{row_name(behaviour, f)} in {len(gained)} seed(s)")
        honest = int(sum(clean["honest_rejected"]))
        clipped = int(sum(clean["honest_clipped"]))
        ratio = max(clean["honest_ratio"], default=float("nan"))
        pending = f", {len(attacked) - measured} not yet" if measured < len(attacked) else ""
        if measured == 0:
            lines.append(f"- **{column}**: not measured yet (no attacked row)")
            continue
        met = measured - len(misses) - len(unresolved)
        only = f", of {len(ROWS) - 1}: the column covers no other" if len(attacked) < len(ROWS) - 1 else ""
        parts = [f"accuracy target met in {met} of {measured} attacked rows"]
        parts.append("missed in " + ("; ".join(misses) if misses else "none"))
        if unresolved:
            parts.append("not resolved in " + "; ".join(unresolved))
        parts.append("hostile on top in " + ("; ".join(on_top) if on_top else "no row"))
        lines.append(
            f"- **{column}** ({measured} attacked rows measured{pending}{only}): "
            + "; ".join(parts)
            + "; honest "
            f"updates rejected in the clean runs: {honest}; clipped: {clipped}; largest honest update-norm "
            f"ratio to the round's median there: {ratio:.1f}; each change paired over "
            f"{_seeds_text(seeds)}"
        )
    return lines


def figure(dirs: list[Path], path: Path, options: Mapping[str, Any]) -> Path:
    """Accuracy change against the clean run, row × column, one panel per f."""
    return draw_figure(collect(dirs[0], options.get("records")), path)


def draw_figure(found: Mapping[tuple[str, str], Mapping[str, list[float]]], path: Path) -> Path:
    """:func:`figure` from collected cells."""
    from fedhet.report.figures import new_figure, save_figure

    columns = list(COLUMNS)
    fig = new_figure(20, 9)
    axes = fig.subplots(1, 2)
    for ax, f in zip(axes, HOSTILE, strict=True):
        names = [row_name(b, f) for b in ATTACKS]
        change = np.array(
            [[change_against_clean(found[n, c], found["clean", c]) for c in columns] for n in names]
        )
        ax.imshow(change, cmap="RdBu", vmin=-60, vmax=60, aspect="auto")
        ax.set_xticks(range(len(columns)), columns, rotation=35, ha="right")
        ax.set_yticks(range(len(names)), list(ATTACKS))
        ax.set_title(f"f = {f} hostile of {CLIENTS}: final accuracy change vs clean (points)")
        for i in range(len(names)):
            for j in range(len(columns)):
                if np.isfinite(change[i, j]):
                    ax.text(j, i, f"{change[i, j]:+.0f}", ha="center", va="center", fontsize=7)
    fig.suptitle("Hostile clients against FedAvg, the robust rules and the contribution methods (defaults)")
    return save_figure(fig, path)


STUDY = Study(
    name="robustness",
    title="hostile clients (every injected behaviour, f = 1 and 3 of 10) against FedAvg, the robust "
    "aggregation rules, CELM, CGSV, ShapFed and FedRAC",
    page="docs/results/robustness.md",
    default_out="runs/robustness",
    cells=cells,
    table=table,
    figure=figure,
    default_figure="docs/figures/robustness.png",
    after_cells=run_engine_check,
    record=run_values,
)


#: The results page (written by :mod:`fedhet.studies.robustness_page`), its records and its command.
PAGE = "docs/results/robustness.md"
#: the records of the finished runs (fedhet.studies.base), relative to the checkout
RECORDS = "docs/results/cells/robustness"
COMMAND = "fedhet robustness run --seeds 3 --jobs 2"
