"""The robustness page's defaults and its two best defences in two more settings (``fedhet study
robustness-settings``; docs/results/robustness-settings.md), so that the choice of defaults is not tuned to
one split: a public table held by sites that each see one group of patients (scikit-learn's diabetes, ten
sites by age decile, ``tabular-mlp``) and CIFAR-10 at CPU scale (10,000 images, ten clients, Dirichlet(0.5),
``cnn``).

Columns (FedAvg): as published (no guard), fedhet's defaults, and :data:`DEFENCES` on top of the defaults
(the robustness page's pick and its strongest defence against direction attacks). Rows: the
clean run and the attacks of :data:`SETTING_ATTACKS` by f = 1 (client 0) or f = 3 (clients 0-2) of the ten
clients, as on the robustness page; each cell is read as there (:func:`fedhet.studies.robustness.run_values`)
and judged against its clean run by the paired 95 % interval (:func:`fedhet.studies.robustness.drop_verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.studies import robustness as rb
from fedhet.studies.base import CompareCell, Study, provenance_lines, recorded_runs
from fedhet.studies.diabetes_tables import TABLE_DIR, age_bands, write_site_tables

#: the two defences measured beside the defaults: centered clipping, the robustness page's rule's pick at
#: 3 seeds of its first rows (its section "The default by measurement"), and nearest-neighbour mixing before
#: the trimmed mean, the column whose worst change at f = 3 was the smallest of every defence there (seed 0
#: of the rows with the attacks built to beat robust rules: -6.6 points, ipm; every other column -9.3 or
#: worse) at a clean cost the rule could not yet judge (-1.3 points at seed 0).
DEFENCES = ("centered-clipping", "nnm-trimmed-mean")
#: the attacks of the rows: every direction and adaptive attack of the robustness page, and one magnitude
#: attack (``scale``) standing for those the guards reject there (noise, nan, inf, lie-num-examples, crash,
#: drop: their updates never reach the rule)
SETTING_ATTACKS = (
    "scale", "sign-flip", "stale", "label-flip", "free-rider", "replay", "alie", "ipm", "adaptive-scale",
    "min-max", "min-sum", "mimic",
)  # fmt: skip
#: CIFAR-10 runs ~15x a table run: its rows are the attacks that move the robustness page's defaults most
CIFAR_ATTACKS = ("sign-flip", "label-flip", "ipm", "adaptive-scale", "min-max", "mimic")
TABLE_FILE = "diabetes-by-age-10"
#: setting -> (its description, its shipped config, its overrides, its attacks)
SETTINGS: dict[str, tuple[str, str, dict[str, Any], tuple[str, ...]]] = {
    "diabetes-by-age-10": (
        "scikit-learn's diabetes (442 patients, 10 features; label: progression above the median), held by "
        "ten sites by age decile of the training patients (a natural split, 22 to 42 patients a site), "
        "`tabular-mlp`, 100 rounds of one local epoch, SGD lr 0.1, batch 64; 88 test patients (one is 1.1 "
        "points)",
        "tables/fedavg-100",
        {
            "data.dataset": "csv",
            "data.path": str(TABLE_DIR / f"{TABLE_FILE}.csv"),
            "data.test_path": str(TABLE_DIR / "diabetes-test.csv"),
            "data.label_column": "progression",
            "data.client_column": "site",
            "data.split": "sites",
            "data.split_params": {},
            "data.clients": 10,
            "train.lr": 0.1,  # fixed, as the robustness page fixes its own (tabular-mlp's default is 0.3)
        },
        SETTING_ATTACKS,
    ),
    "cifar10-n10": (
        "CIFAR-10, 10,000 training images, ten clients, Dirichlet(0.5) over classes, `cnn`, 20 rounds of one "
        "local epoch, SGD lr 0.05, batch 64; 5,000 test images",
        "robustness/cifar10-n10",
        {},
        CIFAR_ATTACKS,
    ),
}


def _variants(f: int) -> dict[str, dict[str, Any]]:
    rules = rb._rules(max(f, 1))
    return {"undefended": rb.UNDEFENDED, "defaults": {}, **{d: rules[d] for d in DEFENCES}}


def column_name(variant: str) -> str:
    names = {"undefended": "FedAvg", "defaults": "FedAvg, defaults"}
    return names.get(variant, f"+ {rb.RULE_COLUMNS.get(variant, variant)}")


def rows(setting: str) -> tuple[tuple[str, int], ...]:
    return rb._rows(SETTINGS[setting][3])


def cells() -> list[CompareCell]:
    out = []
    for setting, (_, config, split, _) in SETTINGS.items():
        for behaviour, f in rows(setting):
            fault: dict[str, Any] = {}
            if behaviour != "clean":
                fault = {f"faults.clients.{c}": behaviour for c in rb.HOSTILE[f]}
                fault.update(rb.BEHAVIOUR_SETTINGS.get(behaviour, {}))
            for variant, sets in _variants(f).items():
                overrides = {**split, "guards.max_all_rejected_rounds": 0, **fault, **sets}
                path = f"{setting}/{rb.row_name(behaviour, f)}/{variant}"
                out.append(CompareCell(path, config, ("fedavg",), overrides))
    return out


def write_table() -> None:
    """The ten-site table (idempotent: the same bytes every time)."""
    write_site_tables({TABLE_FILE: age_bands(10)})


Found = dict[tuple[str, str, str], dict[str, list[Any]]]


def collect(records: Path) -> Found:
    """(setting, row, column) -> the seeds' values ("seed", "accuracy", "weight", "top"), from the records."""
    found: Found = {}
    for cell in cells():
        setting, rest = cell.path.split("/", 1)
        row, _, variant = rest.rpartition("/")
        values: dict[str, list[Any]] = {"seed": [], "accuracy": [], "weight": [], "top": []}
        for record in recorded_runs(records, cell, "fedavg"):
            values["seed"].append(record["seed"])
            for key in ("accuracy", "weight", "top"):
                values[key].append(record["values"].get(key, float("nan")))
        found[setting, row, column_name(variant)] = values
    return found


def _columns() -> list[str]:
    return [column_name(v) for v in _variants(1)]


def setting_lines(found: Found, setting: str) -> list[str]:
    """One setting's table (final accuracy, change against the column's clean run) and its verdicts."""
    if not any(v["accuracy"] for (s, _, _), v in found.items() if s == setting):
        return ["Not measured yet: `fedhet study robustness-settings run` runs it (resumable)."]
    columns = _columns()
    head = ["| hostile clients | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    body, verdicts = [], {c: {"meets": 0, "misses": [], "unresolved": 0} for c in columns}
    for behaviour, f in rows(setting):
        name = rb.row_name(behaviour, f)
        cells_: list[str] = []
        for column in columns:
            cell, clean = found[setting, name, column], found[setting, "clean", column]
            if not cell["accuracy"]:
                cells_.append("–")
                continue
            accuracy = 100 * float(np.nanmean(cell["accuracy"]))
            if behaviour == "clean":
                cells_.append(f"{accuracy:.1f}")
                continue
            verdict, mean, low, high = rb.drop_verdict(cell, clean, rb.TARGET_DROP[f])
            cells_.append(f"{accuracy:.1f} ({mean:+.1f})")
            if verdict == "meets":
                verdicts[column]["meets"] += 1
            elif verdict == "misses":
                verdicts[column]["misses"].append(f"{name} {mean:+.1f} [{low:+.1f}, {high:+.1f}]")
            else:
                verdicts[column]["unresolved"] += 1
        body.append(f"| {name} | " + " | ".join(cells_) + " |")
    seeds = sorted({len(v["accuracy"]) for (s, _, _), v in found.items() if s == setting and v["accuracy"]})
    seeds_text = (
        "–".join(str(n) for n in (seeds[0], seeds[-1])) if len(seeds) > 1 else str(seeds[0] if seeds else 0)
    )
    lines = [*head, *body, ""]
    lines.append(
        f"Each cell: final accuracy % (change against the column's clean run, paired by seed), mean of "
        f"{seeds_text} seeds. Targets as on the robustness page: the paired 95 % interval of the change lies "
        f"above −{rb.TARGET_DROP[1]:g} points at f = 1 and −{rb.TARGET_DROP[3]:g} at f = 3 (met), below it "
        "(missed), or straddles it (not resolved)."
    )
    lines.append("")
    for column in columns:
        v = verdicts[column]
        missed = "; ".join(v["misses"]) or "none"
        lines.append(
            f"- **{column}**: target met in {v['meets']}, not resolved in {v['unresolved']}, "
            f"missed in {missed}."
        )
    return lines


def summary_lines(
    found: Found, main: Mapping[tuple[str, str], Mapping[str, list[float]]] | None
) -> list[str]:
    """Per column and setting (the robustness page's beside them): clean cost against FedAvg as published
    and the worst mean change at f = 3 and f = 1, with its attack."""
    settings = list(SETTINGS)
    views: dict[str, dict[tuple[str, str], Mapping[str, list[float]]]] = {
        setting: {(row, column): v for (s, row, column), v in found.items() if s == setting}
        for setting in settings
    }
    if main:
        views = {"robustness page": dict(main), **views}
    out = ["| column | " + " | ".join(views) + " |", "|---" * (len(views) + 1) + "|"]
    for column in _columns():
        out.append(
            f"| {column} | " + " | ".join(_summary_cell(view, column) for view in views.values()) + " |"
        )
    return [
        *out,
        "",
        "Each cell: the clean cost against FedAvg as published (points, paired by seed); the worst mean "
        "change against the column's clean run at f = 3, then at f = 1, with the attack (over the attacks "
        "the setting measures: the robustness page measures more).",
    ]


def _summary_cell(view: Mapping[tuple[str, str], Mapping[str, list[float]]], column: str) -> str:
    clean, base = view.get(("clean", column)), view.get(("clean", "FedAvg"))
    if not clean or not clean["accuracy"] or not base:
        return "–"
    cost = rb.paired_changes(clean, base)
    worst = []
    for f in (3, 1):
        changes = {
            row: float(np.mean(d))
            for (row, c), cell in view.items()
            if c == column
            and row.endswith(f"/f{f}")
            and cell["accuracy"]
            and (d := rb.paired_changes(cell, clean))
        }
        row = min(changes, key=lambda r: changes[r]) if changes else None
        worst.append(f"{changes[row]:+.1f} ({row.split('/')[0]})" if row else "–")
    cost_text = f"{float(np.mean(cost)):+.1f}" if cost else "–"
    return f"{cost_text}; {worst[0]}; {worst[1]}"


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    records = Path(options.get("records") or f"docs/results/cells/{STUDY.name}")
    found = collect(records)
    out: list[str] = []
    for setting, (description, config, _, _) in SETTINGS.items():
        out += [f"## {setting}", "", f"{description} (`{config}`).", "", *setting_lines(found, setting), ""]
    return "\n".join(out)


def write_page(dirs: list[Path], options: Mapping[str, Any]) -> str:
    """docs/results/robustness-settings.md from the records (and the robustness page's, for the summary)."""
    records = Path(options.get("records") or f"docs/results/cells/{STUDY.name}")
    found = collect(records)
    main_records = Path(rb.RECORDS)
    main = rb.collect(None, main_records) if main_records.is_dir() else None
    text = "\n".join(
        [
            "# Robustness in two more settings",
            "",
            "Do the robustness page's defaults and two of its defences hold away from its one setting "
            "(Fashion-MNIST, ten clients, Dirichlet(0.5))? The same attacks by one or three of ten clients, "
            "in a public table held by ten sites by age and in CIFAR-10 at CPU scale. Generated by "
            "`fedhet study robustness-settings page` from the records (the summary's first column from the "
            "robustness page's); do not edit by hand. Columns: FedAvg as published (no guard), fedhet's "
            "defaults, and on top of them "
            + " and ".join(f"`{d}`" for d in DEFENCES)
            + " (the robustness page's pick by its rule, and its smallest worst change at f = 3 at a clean "
            "cost its rule has not resolved; [robustness.md](../robustness.md) describes each). A setting "
            "not measured yet shows –.",
            "",
            *provenance_lines(STUDY.name, STUDY.default_seeds, records),
            "",
            "## Summary",
            "",
            *summary_lines(found, main),
            "",
            table([], {"records": records}),
        ]
    )
    page = Path(STUDY.page)
    page.write_text(text.rstrip() + "\n")
    return f"wrote {page}"


def run_values(cell: CompareCell, run_dir: Path, method: str) -> dict[str, Any]:
    """The robustness page's values of one run (its row read from the cell's path under the setting)."""
    return rb.run_values(cell, run_dir, method)


STUDY = Study(
    name="robustness-settings",
    title="the robustness page's defaults and two defences on a ten-site table and on CIFAR-10",
    page="docs/results/robustness-settings.md",
    default_out="runs/robustness-settings",
    default_seeds=3,
    cells=cells,
    table=table,
    record=run_values,
    actions={"page": write_page},
    before_cells=write_table,
)
