"""Do fedhet's training defaults train a table? FedAvg with ``tabular-mlp`` on three public tables against
pooled logistic regression (the page docs/results/table-defaults.md; docs/your-own-data.md).

Per federation: the defaults (``tabular-mlp``'s own learning rate 0.3, batch 64, one local epoch), fedhet's
general learning rate 0.1 (the default of every other model, and of ``tabular-mlp`` before: a site of 60 rows
takes one step per round at batch 64, too few at that rate), the same with batch 16 (more steps per round on
small sites), and the same model trained on the pooled rows (one client: what the model can do without
federation), each for 100 rounds and read at rounds 10 (fedhet's default ``train.rounds``),
30 and 100 from one run (a constant learning rate: a shorter run is the start of the longer one). The
reference is scikit-learn's ``LogisticRegression`` (defaults, lbfgs) on the pooled, standardised training
rows of the same train/test split, computed when the page is rendered (deterministic, seconds).

Federations: breast-cancer and wine (scikit-learn's; 5 clients, Dirichlet(1) over classes) and diabetes
held by six sites by age band, a natural split (the table of ``contribution-estimators``, written under
runs/tables/ by its ``write_tables``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.studies.base import CompareCell, Study, provenance_lines, recorded_runs
from fedhet.studies.diabetes_tables import TABLE_DIR, write_tables

CONFIG = "tables/fedavg-100"
#: the rounds each run is read at
READ_AT = (10, 30, 100)
#: a federation within this many points of pooled logistic regression meets the target
TARGET_POINTS = 2.0

_DIRICHLET = {"data.split": "dirichlet-per-class", "data.split_params": {"alpha": 1.0}, "data.clients": 5}
_DIABETES = {
    "data.dataset": "csv",
    "data.path": str(TABLE_DIR / "diabetes-by-age.csv"),
    "data.test_path": str(TABLE_DIR / "diabetes-test.csv"),
    "data.label_column": "progression",
    "data.client_column": "site",
}
#: federation -> (its description, its split, the same rows pooled into one client)
FEDERATIONS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "breast-cancer": (
        "scikit-learn's breast-cancer (569 rows, 30 features, 2 classes), 5 clients, Dirichlet(1)",
        {"data.dataset": "breast-cancer", **_DIRICHLET},
        {"data.dataset": "breast-cancer", "data.split": "iid", "data.split_params": {}, "data.clients": 1},
    ),
    "wine": (
        "scikit-learn's wine (178 rows, 13 features, 3 classes), 5 clients, Dirichlet(1)",
        {"data.dataset": "wine", **_DIRICHLET},
        {"data.dataset": "wine", "data.split": "iid", "data.split_params": {}, "data.clients": 1},
    ),
    "diabetes-by-age": (
        "scikit-learn's diabetes (442 patients, 10 features; label: progression above the median), "
        "held by six sites by age band (a natural split)",
        {**_DIABETES, "data.split": "sites", "data.split_params": {}, "data.clients": 6},
        {**_DIABETES, "data.split": "iid", "data.split_params": {}, "data.clients": 1},
    ),
}
#: variant -> its row label
VARIANTS: dict[str, str] = {
    "defaults": "fedhet's defaults (lr 0.3, batch 64)",
    "lr-0.1": "lr 0.1 (batch 64)",
    "batch-16": "lr 0.1, batch 16",
    "pooled": "one client holding every row (lr 0.3, batch 64)",
}


def _cell(name: str, variant: str) -> CompareCell:
    _, split, pooled = FEDERATIONS[name]
    overrides = {
        "defaults": split,
        "lr-0.1": {**split, "train.lr": 0.1},
        "batch-16": {**split, "train.lr": 0.1, "train.batch_size": 16},
        "pooled": pooled,
    }[variant]
    return CompareCell(f"{name}/{variant}", CONFIG, ("fedavg",), overrides)


def cells() -> list[CompareCell]:
    return [_cell(name, variant) for name in FEDERATIONS for variant in VARIANTS]


def run_values(cell: CompareCell, run: Path, method: str) -> dict[str, Any]:
    """What the page reads of one run: test accuracy at each round of :data:`READ_AT`."""
    from fedhet.engine.rundir import read_metrics

    by_round = {line["round"]: line["accuracy"] for line in read_metrics(run) if "accuracy" in line}
    return {"accuracy_at": {str(r): by_round[r] for r in READ_AT if r in by_round}}


def pooled_logistic_regression(name: str) -> tuple[float, int]:
    """Test accuracy of scikit-learn's LogisticRegression on the federation's pooled training rows,
    standardised with their mean and std, on the same test rows fedhet evaluates on; and their number."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from fedhet.api import as_config
    from fedhet.engine.simulation import get_dataset, table_options

    write_tables()  # the diabetes sites' files, when absent
    cfg = as_config(CONFIG, FEDERATIONS[name][1])
    data = get_dataset(cfg.data.dataset, cfg.data.root, cfg.data.path, table_options(cfg))
    flat = lambda t: t.numpy().reshape(len(t), -1)  # noqa: E731
    x_train, x_test = flat(data.train_x), flat(data.test_x)
    scaler = StandardScaler().fit(x_train)
    model = LogisticRegression(max_iter=10_000).fit(scaler.transform(x_train), data.train_y.numpy())
    return float((model.predict(scaler.transform(x_test)) == data.test_y.numpy()).mean()), len(x_test)


def _accuracies(records: Path, name: str, variant: str) -> dict[int, list[float]]:
    """round -> the recorded seeds' accuracies (in %)."""
    out: dict[int, list[float]] = {r: [] for r in READ_AT}
    for record in recorded_runs(records, _cell(name, variant), "fedavg"):
        for r in READ_AT:
            if str(r) in record["values"]["accuracy_at"]:
                out[r].append(100 * record["values"]["accuracy_at"][str(r)])
    return out


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{np.mean(values):.1f} ± {np.std(values, ddof=1):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


def table(dirs: list[Path], options: Mapping[str, Any]) -> str:
    records = Path(options.get("records") or f"docs/results/cells/{STUDY.name}")
    lines = []
    for name, (description, _, _) in FEDERATIONS.items():
        accuracy, test_rows = pooled_logistic_regression(name)
        lines += [
            f"### {name}",
            "",
            f"{description}; {test_rows} test rows (one row is {100 / test_rows:.1f} points). Pooled "
            f"logistic regression: **{100 * accuracy:.1f} %**.",
            "",
            "| training | seeds | " + " | ".join(f"{r} rounds" for r in READ_AT) + " |",
            "|---|---|" + "---|" * len(READ_AT),
        ]
        for variant, label in VARIANTS.items():
            found = _accuracies(records, name, variant)
            seeds = len(found[READ_AT[-1]])
            lines.append(f"| {label} | {seeds} | " + " | ".join(_mean_sd(found[r]) for r in READ_AT) + " |")
        lines.append("")
    return "\n".join(lines)


def findings(records: Path) -> list[str]:
    """Per federation: the defaults' gap to pooled logistic regression at 100 rounds against the target,
    what the same model reaches on the pooled rows, the general learning rate 0.1's gap at 100 rounds, and
    what batch 16 changes at 10 rounds at that rate."""
    out = []
    for name in FEDERATIONS:
        defaults = _accuracies(records, name, "defaults")
        if not defaults[100]:
            continue
        accuracy, test_rows = pooled_logistic_regression(name)
        reference = 100 * accuracy
        gap = float(np.mean(defaults[100])) - reference
        pooled = _accuracies(records, name, "pooled")[100]
        general = _accuracies(records, name, "lr-0.1")
        small = _accuracies(records, name, "batch-16")[10]
        verdict = "meets" if gap >= -TARGET_POINTS else "misses"
        text = (
            f"- **{name}**: the defaults at 100 rounds are {gap:+.1f} points from pooled logistic "
            "regression: "
            f"{verdict} the {TARGET_POINTS:g}-point target (one test row is {100 / test_rows:.1f} points)"
        )
        if pooled:
            text += f"; the same model on the pooled rows: {float(np.mean(pooled)) - reference:+.1f}"
        if general[100]:
            step_gap = float(np.mean(general[100])) - reference
            step_verdict = "meets" if step_gap >= -TARGET_POINTS else "misses"
            text += f"; lr 0.1 at 100 rounds: {step_gap:+.1f} ({step_verdict} the target)"
        if small and general[10]:
            text += (
                f"; at 10 rounds and lr 0.1, batch 16 gives "
                f"{float(np.mean(small)) - float(np.mean(general[10])):+.1f} points over batch 64"
            )
        out.append(text + ".")
    return out


def write_page(dirs: list[Path], options: Mapping[str, Any]) -> str:
    """docs/results/table-defaults.md from the records."""
    records = Path(options.get("records") or f"docs/results/cells/{STUDY.name}")
    text = "\n".join(
        [
            "# Training defaults on tables",
            "",
            "Does `fedhet run` with its defaults train a table? FedAvg with `tabular-mlp` and its training "
            "defaults (its own learning rate 0.3, batch 64, one local epoch), read at 10 rounds (the "
            "default `train.rounds`), 30 and 100 rounds of one run, against scikit-learn's "
            "LogisticRegression on the pooled, standardised training rows of the same split (computed when "
            "this page is rendered). Also: fedhet's general learning rate 0.1 (every other model's default, "
            "and tabular-mlp's before), the same with batch 16, and the same model on the pooled rows (one "
            "client). "
            f"Test accuracy in %, mean ± sd over seeds (`{CONFIG}`).",
            "",
            *provenance_lines(STUDY.name, STUDY.default_seeds, records),
            "",
            "## Findings (computed from the records)",
            "",
            *(findings(records) or ["- no records yet"]),
            "",
            "## Accuracy by rounds",
            "",
            table([], {"records": records}),
        ]
    )
    page = Path(STUDY.page)
    page.write_text(text.rstrip() + "\n")
    return f"wrote {page}"


STUDY = Study(
    name="table-defaults",
    title="fedhet's training defaults on three public tables against pooled logistic regression",
    page="docs/results/table-defaults.md",
    default_out="runs/table-defaults",
    default_seeds=5,
    cells=cells,
    table=table,
    record=run_values,
    actions={"page": write_page},
    before_cells=write_tables,
)
