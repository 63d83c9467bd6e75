"""Reproduce a published table: run its rows with fedhet and print our numbers beside the paper's.

A table is a TOML file (``configs/reproduce/*.toml``)::

    title = "CELM Table 1 (Fashion-MNIST): global-model test accuracy"
    source = "paper-results.md, CELM Table 1"
    metric = "accuracy"          # a metric of summary.json
    view = "final"               # final | best | last
    scale = 100                  # display scale (accuracies in %)
    seeds = 3
    methods = ["fedavg", "celm"]
    gaps = '''Differences to the paper and their verified causes (shown on the result page).'''

    [method_params]                              # optional: parameters of one method in every row
    shapfed = { protocol = "global" }

    [[rows]]
    name = "Dir 0.05"
    config = "../celm/fmnist-dir0.05.toml"      # relative to this file
    set = ["data.validation_fraction=0.1"]      # optional overrides
    paper = { fedavg = "81.63 ± 2.69", celm = "83.64 ± 0.42" }
    scales = { cpu = ["data.split_params.alpha=0.1"] }   # optional: this row's own overrides at a scale
    runs = "dir-0.05"                            # optional: its runs' folder under --out (default: from name)

    [[rows]]
    name = "FedISIC natural"
    available = false                            # data not obtainable offline: listed, not run
    note = "FedISIC is not obtainable offline"
    paper = { fedavg = "61.25 ± 0.04" }

    [[rows]]
    name = "GPL baseline"
    config = "../proxyfl/cifar10-alpha0.1.toml"
    methods = ["fixmatch-gpl"]                   # optional: only these of the table's methods in this row
    paper = { fixmatch-gpl = 84.56 }

    [scales.quick]                               # optional: `--scale quick` (default: QUICK below)
    seeds = 1
    set = ["train.rounds=2", "train.local_steps=5"]
    note = "2 rounds of 5 steps: checks the pipeline, not a result"

    [scales.cpu]                                 # `--scale cpu` (default: the full scale, said so)
    set = ["train.rounds=50"]
    note = "50 of the paper's 200 rounds"

A row's own ``scales`` apply after the scale's and before the user's ``--set`` (e.g. a split whose per-label
sample bounds must shrink with a reduced training set); the page lists them under the table.

A row's runs go to a folder of ``--out`` named after the row (``Dir 0.05`` -> ``dir-0.05``), or ``runs``.
Runs of the same experiment are reused from there, so two tables given the same ``--out`` share their cells
when their rows' folders match: ``runs`` names the folder of another table's row.

``--scale full`` is the table as written (the papers' settings). Every printed table and result page says
its scale and how many rounds, clients and seeds each row used, so a reduced-scale run is never mistaken for a
full reproduction.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.config import ExperimentConfig, apply_override, load_config, parse_set_args
from fedhet.errors import ConfigError

SPEC_DIR = Path(__file__).resolve().parent / "configs" / "reproduce"  # package data
_PM = re.compile(r"^\s*(-?[\d.]+)\s*(?:±|\+-|\+/-)\s*([\d.]+)\s*$")


@dataclass
class Row:
    name: str
    config: Path | None
    overrides: list[str] = field(default_factory=list)
    paper: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    available: bool = True
    note: str = ""
    metric: str | None = None  # overrides the table's metric for this row
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # merged over the table's
    methods: list[str] = field(default_factory=list)  # only these of the table's methods (empty: all)
    scale: float | None = None  # overrides the table's display scale for this row (e.g. ×100 accuracies)
    #: Phase A of a two-phase row: (config, method) run first with the row's seeds and scale; every method of
    #: the row then starts from its final global model of the same seed (``model.init_from``).
    warmstart: tuple[Path, str] | None = None
    #: This row's own overrides at a reduced scale ("quick"/"cpu" -> --set values), after the scale's.
    scale_overrides: dict[str, list[str]] = field(default_factory=dict)
    #: The folder of this row's runs under the output directory (default: the name, slugged).
    runs: str = ""

    @property
    def folder(self) -> str:
        return self.runs or re.sub(r"[^A-Za-z0-9.]+", "-", self.name).strip("-").lower()


@dataclass(frozen=True)
class Scale:
    """One scale of a table: seeds (None = the table's), config overrides and what it cut."""

    name: str
    seeds: int | None = None
    overrides: tuple[str, ...] = ()
    note: str = ""


SCALES = ("quick", "cpu", "full")
#: The quick scale of a table that defines none: one seed, 2 short rounds.
QUICK = Scale(
    "quick",
    seeds=1,
    # The training set is not cut: the papers' splits (e.g. pure label skew) need their label counts.
    overrides=("train.rounds=2", "train.local_steps=5", "data.max_test_samples=500", "eval.every=1"),
    note="1 seed, 2 rounds of 5 local steps, 500 test samples: checks the pipeline, not a result",
)


@dataclass
class Spec:
    path: Path
    title: str
    source: str
    metric: str
    view: str
    scale: float
    seeds: int
    methods: list[str]
    rows: list[Row]
    notes: str = ""
    #: Per-method parameters for every row (the parity settings, e.g. CFFL's protocol).
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The quick and cpu scales ("full" is the table as written).
    scales: dict[str, Scale] = field(default_factory=dict)
    #: Verified causes of the differences to the paper (Markdown, for the result page).
    gaps: str = ""
    #: Validity gates printed with each row ("fssl": fedhet.report.fssl_gates), or none.
    gates: str = ""

    def at_scale(self, name: str) -> Scale:
        """The named scale: ``full`` as written, ``quick``/``cpu`` from the table or their defaults."""
        if name not in SCALES:
            raise ConfigError(f"scale {name!r}; choose one of {', '.join(SCALES)}")
        if name in self.scales:
            return self.scales[name]
        if name == "quick":
            return QUICK
        if name == "cpu":
            return Scale("cpu", note="the paper's settings (they fit a 2-core machine)")
        return Scale("full", note="the paper's settings")


def parse_paper_value(text: Any) -> tuple[float, float | None]:
    """``"80.64 ± 2.25"`` -> (80.64, 2.25); a bare number -> (value, None)."""
    if isinstance(text, int | float):
        return float(text), None
    m = _PM.match(str(text))
    if m:
        return float(m.group(1)), float(m.group(2))
    try:
        return float(text), None
    except ValueError as exc:
        raise ConfigError(f"paper value {text!r} must look like '80.64 ± 2.25' or a number") from exc


def resolve_spec_path(name: str) -> Path:
    """A path, or the name of a table in configs/reproduce/ (with or without .toml)."""
    p = Path(name)
    if p.is_file():
        return p
    for cand in (SPEC_DIR / name, SPEC_DIR / f"{name}.toml"):
        if cand.is_file():
            return cand
    raise ConfigError(f"no reproduction table {name!r}; available: {', '.join(list_specs()) or 'none'}")


def list_specs() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml")) if SPEC_DIR.is_dir() else []


ROW_KEYS = {
    "name",
    "config",
    "set",
    "paper",
    "available",
    "note",
    "metric",
    "method_params",
    "methods",
    "scale",
    "warmstart",
    "scales",
    "runs",
}
GATES = ("", "fssl")
_FOLDER = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


def load_spec(name: str) -> Spec:
    path = resolve_spec_path(name)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    known = {
        "title",
        "source",
        "metric",
        "view",
        "scale",
        "seeds",
        "methods",
        "rows",
        "notes",
        "method_params",
        "scales",
        "gaps",
        "gates",
    }
    bad = set(raw) - known
    if bad:
        raise ConfigError(f"{path}: unknown key(s) {sorted(bad)}; accepted: {sorted(known)}")
    if raw.get("gates", "") not in GATES:
        raise ConfigError(f"{path}: gates={raw.get('gates')!r}; accepted: {', '.join(map(repr, GATES))}")
    if raw.get("view", "final") not in ("final", "best", "last"):
        raise ConfigError(f"{path}: view={raw.get('view')!r}; accepted: 'final', 'best', 'last'")
    rows = []
    for i, r in enumerate(raw.get("rows", [])):
        unknown = set(r) - ROW_KEYS
        if unknown:
            raise ConfigError(f"{path}: row {i} has unknown key(s) {sorted(unknown)}")
        cfg = (path.parent / r["config"]).resolve() if r.get("config") else None
        available = bool(r.get("available", True))
        if available and (cfg is None or not cfg.is_file()):
            raise ConfigError(f"{path}: row {r.get('name', i)!r} needs an existing `config` file (got {cfg})")
        rows.append(
            Row(
                name=r.get("name", f"row {i}"),
                config=cfg,
                overrides=list(r.get("set", [])),
                paper={m: parse_paper_value(v) for m, v in r.get("paper", {}).items()},
                available=available,
                note=r.get("note", ""),
                method_params=_method_params(path, r.get("method_params", {})),
                methods=list(r.get("methods", [])),
                metric=r.get("metric"),
                scale=float(r["scale"]) if "scale" in r else None,
                warmstart=_warmstart(path, r),
                scale_overrides=_row_scales(path, r),
                runs=str(r.get("runs", "")),
            )
        )
        if rows[-1].runs and not _FOLDER.match(rows[-1].runs):
            raise ConfigError(
                f"{path}: row {rows[-1].name!r}: runs={rows[-1].runs!r} must be a folder name of lower-case "
                "letters, digits, '.' and '-' (e.g. 'fashion-mnist-pow')"
            )
        stray = set(rows[-1].methods) - set(raw.get("methods", []))
        if stray:
            raise ConfigError(
                f"{path}: row {rows[-1].name!r} lists methods {sorted(stray)} the table does not"
            )
    return Spec(
        path=path,
        title=raw.get("title", path.stem),
        source=raw.get("source", ""),
        metric=raw.get("metric", "accuracy"),
        view=raw.get("view", "final"),
        scale=float(raw.get("scale", 100)),
        seeds=int(raw.get("seeds", 3)),
        methods=list(raw.get("methods", [])),
        rows=rows,
        notes=raw.get("notes", ""),
        method_params=_method_params(path, raw.get("method_params", {})),
        scales=_scales(path, raw.get("scales", {})),
        gaps=raw.get("gaps", ""),
        gates=raw.get("gates", ""),
    )


def _row_scales(path: Path, row: dict[str, Any]) -> dict[str, list[str]]:
    """A row's ``scales = { cpu = [...] }``: overrides of its own at a reduced scale, checked."""
    raw = row.get("scales", {})
    if not isinstance(raw, dict) or set(raw) - {"quick", "cpu"}:
        raise ConfigError(
            f"{path}: row {row.get('name')!r}: scales must map 'quick' or 'cpu' to a list of overrides, "
            'e.g. scales = { cpu = ["data.split_params.min_samples=20"] }'
        )
    if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in raw.values()):
        raise ConfigError(
            f"{path}: row {row.get('name')!r}: each scale's overrides must be a list of strings"
        )
    return {name: list(values) for name, values in raw.items()}


def _warmstart(path: Path, row: dict[str, Any]) -> tuple[Path, str] | None:
    """A row's ``warmstart = { config = "...", method = "..." }``, checked."""
    raw = row.get("warmstart")
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"config", "method"}:
        raise ConfigError(
            f'{path}: row {row.get("name")!r}: warmstart must be {{ config = "FILE", method = "NAME" }}'
        )
    config = (path.parent / raw["config"]).resolve()
    if not config.is_file():
        raise ConfigError(f"{path}: row {row.get('name')!r}: warmstart config {config} does not exist")
    return config, str(raw["method"])


def _scales(path: Path, raw: Any) -> dict[str, Scale]:
    """``[scales.quick]`` and ``[scales.cpu]`` tables: seeds, set, note."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: scales must be tables, e.g. [scales.quick]")
    out = {}
    for name, table in raw.items():
        if name not in ("quick", "cpu"):
            raise ConfigError(
                f"{path}: scale {name!r}; a table defines 'quick' and 'cpu' ('full' is the table)"
            )
        unknown = set(table) - {"seeds", "set", "note"}
        if unknown:
            raise ConfigError(f"{path}: [scales.{name}] has unknown key(s) {sorted(unknown)}")
        if name == "cpu" and not table.get("note"):
            raise ConfigError(
                f"{path}: [scales.cpu] needs a `note` saying what it cut from the paper's settings"
            )
        seeds = table.get("seeds")
        out[name] = Scale(
            name, int(seeds) if seeds else None, tuple(table.get("set", [])), table.get("note", "")
        )
    return out


def _method_params(path: Path, raw: Any) -> dict[str, dict[str, Any]]:
    """``{method: {param: value}}`` from a spec, every table a table of parameters."""
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError(
            f"{path}: method_params must map method names to tables, e.g. cffl = {{ protocol = 'global' }}"
        )
    return {str(m): dict(v) for m, v in raw.items()}


def _data_missing(cfg: ExperimentConfig) -> str:
    """'' if the row's dataset is available here, else a note saying what is missing."""
    from fedhet.data.datasets import dataset_status

    for status in dataset_status(cfg.data.root):
        if status["name"] == cfg.data.dataset:
            return (
                ""
                if status["available"]
                else f"{cfg.data.dataset} not available here (pass --set data.root=DIR)"
            )
    return ""


def rows_without_data(spec: Spec) -> list[str]:
    """Names of the rows that cannot run here: marked unavailable, or their dataset is not found."""
    out = []
    for row in spec.rows:
        if not row.available or _data_missing(row_config(row, [])):
            out.append(row.name)
    return out


def row_config(row: Row, overrides: list[str]) -> ExperimentConfig:
    return configured(row.config, row.overrides + overrides)


def configured(path: Path, overrides: list[str]) -> ExperimentConfig:
    """The config file at ``path`` with ``--set``-style ``overrides`` applied in order."""
    cfg = load_config(path)
    for key, value in parse_set_args(overrides):
        apply_override(cfg, key, value)
    return cfg


def run_spec(
    spec: Spec,
    *,
    seeds: int | None = None,
    overrides: list[str] | None = None,
    rows: str | Sequence[str] | None = None,
    methods: list[str] | None = None,
    out_dir: Path,
    progress=None,
    jobs: int = 1,
    scale: str = "full",
) -> list[dict[str, Any]]:
    """Run the selected rows at ``scale``; one result dict per row with our mean/std and the paper's value
    per method. The scale's overrides come first, ``overrides`` (the user's) after them. ``rows``: the text
    (or texts) a row's name must contain to run; the others are listed as not part of this reproduction.

    Runs already finished in ``out_dir`` are reused (see :func:`fedhet.comparison.run_comparison`), so an
    interrupted reproduction continues where it stopped.
    """
    from fedhet.comparison import VIEW_KEYS, aggregate_rows, run_comparison

    chosen = spec.at_scale(scale)
    wanted_rows = [rows] if isinstance(rows, str) else list(rows or [])  # a row matching any is run
    user = list(overrides or [])
    n_seeds = seeds or chosen.seeds or spec.seeds
    results = []
    done: dict[tuple, tuple[dict[str, Any], Path]] = {}  # rows that share their runs (e.g. two metrics)
    for row in spec.rows:
        wanted = [m for m in (methods or spec.methods) if not row.methods or m in row.methods]
        own = row.scale_overrides.get(scale, [])  # the row's own cuts at this scale, after the scale's
        overrides = [*chosen.overrides, *own, *user]
        note = row.note + (f" At the {scale} scale this row also sets {', '.join(own)}." if own else "")
        entry: dict[str, Any] = {
            "row": row.name,
            "metric": row.metric or spec.metric,
            "available": row.available,
            "note": note.strip(),
            "methods": {},
        }
        if not row.available:
            for m in wanted:
                entry["methods"][m] = {"paper": row.paper.get(m)}
            results.append(entry)
            continue
        base = row_config(row, overrides or [])
        missing = _data_missing(base)
        left_out = bool(wanted_rows) and not any(w.lower() in row.name.lower() for w in wanted_rows)
        if missing or left_out:  # listed, so a page says which rows it lacks and why
            made_with = " ".join(f"--rows {w!r}" for w in wanted_rows)
            note = missing or f"not part of this reproduction (made with {made_with})"
            entry.update(available=False, note=note, left_out=not missing)
            for m in wanted:
                entry["methods"][m] = {"paper": row.paper.get(m)}
            results.append(entry)
            continue
        seed_list = [base.seed + i for i in range(n_seeds)]
        params = {m: {**spec.method_params.get(m, {}), **row.method_params.get(m, {})} for m in wanted}
        slug = row.folder
        if row.warmstart is not None:  # phase A first; the row's methods start from its models
            warm_config, warm_method = row.warmstart
            warm = configured(warm_config, row.overrides + overrides)
            warm_dir = out_dir / f"{slug}-warmstart"
            run_comparison(warm, [warm_method], seed_list, warm_dir, progress=progress, jobs=jobs)
            base.model.init_from = str(warm_dir / f"{warm_method}-seed{{seed}}")
        key = (base.fingerprint(), tuple(wanted), tuple(seed_list), json.dumps(params, sort_keys=True))
        if key not in done:
            while any(d[1] == out_dir / slug for d in done.values()):
                slug += "-b"
            summaries = run_comparison(
                base, wanted, seed_list, out_dir / slug, method_params=params, progress=progress, jobs=jobs
            )
            done[key] = ({r["method"]: r for r in aggregate_rows(summaries)}, out_dir / slug)
        agg, run_dir = done[key]
        entry.update(
            {
                "rounds": base.train.rounds,
                "seeds": seed_list,
                "clients": base.data.clients,
                "model": base.model.name,
                "run_dir": str(run_dir),
            }
        )
        key_mean, key_std = VIEW_KEYS[spec.view]
        metric = entry["metric"]
        factor = row.scale if row.scale is not None else spec.scale
        for m in wanted:
            mean = agg[m][key_mean].get(metric)
            std = agg[m][key_std].get(metric)
            entry["methods"][m] = {
                "ours": None if mean is None else factor * mean,
                "ours_std": None if std is None else factor * std,
                "defined_seeds": agg[m]["defined"][spec.view].get(metric),  # seeds with a value (None: n/a)
                "paper": row.paper.get(m),
                "diverged": agg[m].get("diverged") or {},  # seed -> round the engine stopped the run in
            }
        results.append(entry)
    return results


def _cell(v: dict[str, Any], seeds: int = 2) -> str:
    """``ours ± std / paper ± std / Δ``; one seed has no std, so none is shown. A metric with no value in
    some seeds (Pearson of equal rewards) says in how many it had one, or that it had none."""
    ours, paper = v.get("ours"), v.get("paper")
    defined = v.get("defined_seeds")
    parts = []
    if ours is not None and math.isfinite(ours):
        n = seeds if defined is None else defined
        mean = f"**{ours:.2f}" + (f" ± {v.get('ours_std') or 0:.2f}**" if n > 1 else "**")
        parts.append(mean + (f" (a value in {n} of {seeds} seeds)" if n < seeds else " (1 seed)" * (n == 1)))
    else:
        parts.append("undefined in every seed" if defined == 0 else "—")
    if paper is not None:
        p, ps = paper
        parts.append(f"paper {p:.2f}" + (f" ± {ps:.2f}" if ps is not None else ""))
        if ours is not None and math.isfinite(ours):
            parts.append(f"Δ {ours - p:+.2f}")
    diverged = v.get("diverged") or {}
    if diverged:  # its views are the global model at the stop (see the note under the table)
        rounds = ", ".join(str(r) for _, r in sorted(diverged.items()))
        parts.append(f"diverged in {len(diverged)} of {seeds} seeds (stopped in round {rounds})")
    return " / ".join(parts)


def render_markdown(spec: Spec, results: list[dict[str, Any]], scale: str | None = None) -> str:
    """A Markdown table: one row per table row, a cell per method with ours / paper / difference."""
    methods = sorted({m for r in results for m in r["methods"]}, key=lambda m: (spec.methods + [m]).index(m))
    lines = [f"## {spec.title}", ""]
    if spec.source:
        lines += [f"Source: {spec.source}. Metric: `{spec.metric}` ({spec.view}), ×{spec.scale:g}.", ""]
    if scale:
        chosen = spec.at_scale(scale)
        lines += [
            f"Scale: **{scale}**: {chosen.note}. Each row's rounds, clients, seeds and model are in its "
            "columns.",
            "",
        ]
    lines += [
        "| row | rounds | clients | seeds | model | " + " | ".join(methods) + " |",
        "|---|---|---|---|---|" + "---|" * len(methods),
    ]
    for r in results:
        if r.get("kept"):  # measured earlier, kept from the page as it was (--keep-page-rows)
            lines.append(r["kept"]["line"])
            continue
        name = labelled(spec, r["row"], r.get("metric") or spec.metric)
        if not r["available"]:
            cells = [
                (f"paper {v['paper'][0]:.2f}" if v.get("paper") else "—")
                for v in (r["methods"].get(m, {}) for m in methods)
            ]
            lines.append(f"| {name} | — | — | — | — | " + " | ".join(cells) + f" |  ← not run: {r['note']}")
            continue
        cells = [_cell(r["methods"].get(m, {}), len(r["seeds"])) for m in methods]
        shape = f"{r['rounds']} | {r.get('clients', '—')} | {len(r['seeds'])} | {r.get('model', '—')}"
        lines.append(f"| {name} | {shape} | " + " | ".join(cells) + " |")
    noted = [
        r["kept"]["note"] if r.get("kept") else f"- {r['row']}: {r['note']}"
        for r in results
        if (r.get("kept") or {}).get("note") or (r["available"] and r.get("note"))
    ]
    if noted:
        lines += [""] + noted
    if any(v.get("diverged") for r in results for v in r["methods"].values()):
        lines += [
            "",
            "*Diverged*: the engine stopped that seed's run when every update of several consecutive "
            "rounds was unusable (non-finite or rejected by the guards, `guards.max_all_rejected_rounds`); "
            "its value is the global model evaluated at the stop, the model the run would end with.",
        ]
    if spec.notes:
        lines += ["", spec.notes.strip()]
    diffs = [
        v["ours"] - v["paper"][0]
        for r in results
        for v in r["methods"].values()
        if r["available"] and v.get("paper") and v.get("ours") is not None and math.isfinite(v["ours"])
    ] + [d for r in results if r.get("kept") for d in r["kept"]["diffs"]]  # kept rows: Δ as printed
    if diffs:
        lines += ["", f"Mean |Δ| over {len(diffs)} cells: {np.mean(np.abs(diffs)):.2f}."]
    lines += gates_section(spec, results)
    return "\n".join(lines) + "\n"


def gates_section(spec: Spec, results: list[dict[str, Any]]) -> list[str]:
    """The table's validity gates per row that ran (``gates = "fssl"``), read from the row's runs."""
    if spec.gates != "fssl":
        return []
    from fedhet.report.fssl_gates import fssl_gates, gates_markdown, read_fssl_runs

    lines: list[str] = []
    for r in results:
        if not r["available"] or not r.get("run_dir"):
            continue
        lines += ["", f"### Validity gates: {r['row']}", ""]
        try:
            lines.append(gates_markdown(fssl_gates(*read_fssl_runs(Path(r["run_dir"])))).rstrip())
        except ValueError as exc:  # a run of only some methods (--methods): the gates need all five
            lines.append(f"Not computed: {exc}.")
    return lines


def write_results(spec: Spec, results: list[dict[str, Any]], out_dir: Path, scale: str | None = None) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "reproduce.json").write_text(
        json.dumps(
            {"spec": str(spec.path), "title": spec.title, "scale": scale, "results": results},
            indent=2,
            default=str,
        )
    )
    md = out_dir / "reproduce.md"
    md.write_text(render_markdown(spec, results, scale=scale))
    write_results_csv(results, out_dir / "reproduce.csv")
    return md


def write_results_csv(results: list[dict[str, Any]], path: Path) -> Path:
    """One line per (table row, method): ours (mean, std over seeds), the paper's value and the difference."""
    import csv

    columns = [
        "row",
        "method",
        "metric",
        "rounds",
        "seeds",
        "ours",
        "ours_std",
        "paper",
        "paper_std",
        "delta",
        "diverged_seeds",
    ]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for r in results:
            for method, v in r["methods"].items():
                ours, paper = v.get("ours"), v.get("paper")
                has_ours = ours is not None and math.isfinite(ours)
                writer.writerow(
                    {
                        "row": r["row"],
                        "method": method,
                        "metric": r.get("metric"),
                        "rounds": r.get("rounds"),
                        "seeds": " ".join(map(str, r.get("seeds") or [])),
                        "ours": ours if has_ours else None,
                        "ours_std": v.get("ours_std") if has_ours else None,
                        "paper": paper[0] if paper else None,
                        "paper_std": paper[1] if paper else None,
                        "delta": ours - paper[0] if paper and has_ours else None,
                        "diverged_seeds": " ".join(map(str, sorted(v.get("diverged") or {}))),
                    }
                )
    return path


# -- result pages (docs/results/<name>.md) ------------------------------------------------------------------
PAGE_MARK = "<!-- fedhet reproduce: table={table} scale={scale} commit={commit} rows={rows} -->"
_PAGE_MARK = re.compile(
    r"<!-- fedhet reproduce: table=(\S+) scale=(\S+) commit=(.+?)(?: rows=(\d+)/(\d+))? -->"
)


def _curves(run_dir: Path, method: str, seeds: list[int], metric: str) -> tuple[list[int], np.ndarray] | None:
    """Rounds and the mean over seeds of ``metric`` per evaluated round (metrics.jsonl of each seed's run)."""
    series = []
    for seed in seeds:
        path = run_dir / f"{method}-seed{seed}" / "metrics.jsonl"
        if not path.is_file():
            return None
        lines = [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
        series.append({ln["round"]: ln[metric] for ln in lines if isinstance(ln.get(metric), int | float)})
    rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
    if not rounds:
        return None
    return rounds, np.array([[s[r] for r in rounds] for s in series]).mean(axis=0)


def _curves_figure(
    rows: list[dict[str, Any]],
    metric_of: Callable[[dict[str, Any]], str],
    factor: float,
    ylabel: str,
    title: str,
    path: Path,
) -> Path | None:
    """One panel per row: each method's ``metric_of(row)`` (× ``factor``, mean over seeds) per evaluated
    round; None when no run has the metric."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(rows))
    nrows = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False, constrained_layout=True
    )
    drawn = False
    for ax, r in zip(axes.flat, rows, strict=False):
        for m in r["methods"]:
            curve = _curves(Path(r["run_dir"]), m, r["seeds"], metric_of(r))
            if curve is not None:
                ax.plot(curve[0], factor * curve[1], label=m, linewidth=0.8)
                drawn = True
        ax.set_title(r["row"], fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel or metric_of(r))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    if not drawn:
        plt.close(fig)
        return None
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def accuracy_figure(spec: Spec, results: list[dict[str, Any]], path: Path) -> Path | None:
    """One panel per measured row: each method's test accuracy (mean over seeds) against the round."""
    rows = [r for r in results if r["available"] and r.get("run_dir")]
    title = f"{spec.title}: accuracy over rounds (mean over seeds)"
    return _curves_figure(rows, lambda r: "accuracy", 100, "test accuracy (%)", title, path)


#: Table metrics computed from the clients' reward accuracies against their standalone accuracies.
REWARD_METRICS = ("fairness_pearson", "fairness_spearman", "bcf_rate", "bcf_rate_code", "ipr")


def metric_figure(spec: Spec, results: list[dict[str, Any]], path: Path) -> Path | None:
    """One panel per measured row whose metric is not the test accuracy (the accuracy figure shows that):
    each method's value of the row's metric per evaluated round, mean over seeds. A table that reports the
    best over rounds shows here how far that maximum is above the level a method holds."""
    rows = [r for r in results if r["available"] and r.get("run_dir") and r.get("metric") != "accuracy"]
    title = "the table's metric per evaluated round (mean over seeds)"
    return _curves_figure(rows, lambda r: r["metric"], 1, "", title, path)


def rewards_figure(spec: Spec, results: list[dict[str, Any]], path: Path) -> Path | None:
    """For tables of reward metrics (fairness, rate): one panel per measured row, every client's final
    reward accuracy against its standalone accuracy (what the fairness correlation and the α-BCF bound
    compare), per method, all seeds, with the line reward = standalone."""
    if spec.metric not in REWARD_METRICS:
        return None
    panels: list[tuple[str, str, np.ndarray, np.ndarray]] = []
    for r in results:
        if not (r["available"] and r.get("run_dir")):
            continue
        for m in r["methods"]:
            xs, ys = [], []
            for seed in r["seeds"]:
                summary = Path(r["run_dir"]) / f"{m}-seed{seed}" / "summary.json"
                data = json.loads(summary.read_text()) if summary.is_file() else {}
                if data.get("rewards") and data.get("standalone"):
                    xs += data["standalone"]
                    ys += data["rewards"]
            if xs:
                panels.append((r["row"], m, 100 * np.array(xs, float), 100 * np.array(ys, float)))
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({p[0] for p in panels}, key=[r["row"] for r in results].index)
    methods = list(dict.fromkeys(p[1] for p in panels))
    fig, axes = plt.subplots(
        len(rows),
        len(methods),
        figsize=(2.4 * len(methods), 2.5 * len(rows)),
        squeeze=False,
        constrained_layout=True,
    )
    for i, row in enumerate(rows):
        for j, m in enumerate(methods):
            ax = axes[i][j]
            mine = [p for p in panels if p[0] == row and p[1] == m]
            if not mine:
                ax.axis("off")
                continue
            _, _, x, y = mine[0]
            ax.scatter(x, y, s=10, alpha=0.7)
            low, high = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
            ax.plot([low, high], [low, high], color="grey", linewidth=0.7, linestyle="--")
            ax.set_title(f"{m}" + (f"\n{row}" if j == 0 else ""), fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("standalone %", fontsize=7)
            if j == 0:
                ax.set_ylabel("final reward %", fontsize=7)
            ax.grid(alpha=0.3)
    fig.suptitle("every client's final reward against its standalone accuracy (all seeds)", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def weights_figure(spec: Spec, results: list[dict[str, Any]], path: Path) -> Path | None:
    """Each row's final per-client contribution weights (or reward accuracies), mean over seeds, per method
    that has them (CELM, CGSV, ShapFed; FedRAC, CFFL rewards)."""
    panels = []
    for r in results:
        if not (r["available"] and r.get("run_dir")):
            continue
        for m in r["methods"]:
            values = []
            for seed in r["seeds"]:
                summary = Path(r["run_dir"]) / f"{m}-seed{seed}" / "summary.json"
                if summary.is_file():
                    data = json.loads(summary.read_text())
                    key = (
                        "contributions"
                        if data.get("contributions")
                        else "rewards"
                        if data.get("rewards")
                        else None
                    )
                    if key:
                        values.append((key, data[key]))
            if values and len({k for k, _ in values}) == 1:
                vals = np.array([v for _, v in values], dtype=float)
                panels.append((r["row"], m, values[0][0], np.nanmean(vals, axis=0)))
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({p[0] for p in panels}, key=[r["row"] for r in results].index)
    cols = min(3, len(rows))
    nrows = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False, constrained_layout=True
    )
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    for ax, row in zip(axes.flat, rows, strict=False):
        mine = [p for p in panels if p[0] == row]
        width = 0.8 / len(mine)
        for i, (_, m, key, vals) in enumerate(mine):
            ax.bar(np.arange(len(vals)) + i * width, vals, width, label=f"{m} ({key})")
        ax.set_title(row)
        ax.set_xlabel("client")
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(
        f"{spec.title}: final contribution weights / reward accuracies (mean over seeds)", fontsize=9
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def cell_provenance(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs behind a page's cells (read from their summary.json): how many, their summed wall time, and
    the fedhet commits that computed them (where recorded)."""
    runs, seconds, commits = 0, 0.0, set()
    seen = set()
    for r in results:
        if not (r["available"] and r.get("run_dir")):
            continue
        for m in r["methods"]:
            for seed in r["seeds"]:
                path = Path(r["run_dir"]) / f"{m}-seed{seed}" / "summary.json"
                if path in seen or not path.is_file():
                    continue
                seen.add(path)
                summary = json.loads(path.read_text())
                runs += 1
                seconds += float(summary.get("wall_time_s") or 0.0)
                # every commit a run's rounds were computed at (a resumed run may have several); older
                # summaries name one, read when they were written
                stretches = summary.get("fedhet_commits") or [{"commit": summary.get("fedhet_commit")}]
                commits.update(str(c["commit"]) for c in stretches if c.get("commit"))
    return {"runs": runs, "run_seconds": seconds, "commits": sorted(commits)}


def render_page(
    spec: Spec,
    results: list[dict[str, Any]],
    *,
    scale: str,
    command: str,
    commit: str,
    wall_s: float,
    machine: str,
    figures: list[tuple[str, str]],
    kept: PageRows | None = None,
) -> str:
    """A result page: provenance, the paper-layout table (ours ± std / paper / Δ), figures, and the
    verified causes of the gaps. With ``kept`` (the page as it was), rows kept from it keep their lines,
    commands, provenance and figures."""
    table = render_markdown(spec, results, scale=scale).split("\n", 2)[2]  # without its "## title" line
    cells = cell_provenance(results)
    if cells["runs"]:
        made = (
            ", ".join(cells["commits"])
            if cells["commits"]
            else "not recorded (runs from before commits were)"
        )
        ran = [f"`{r['row']}`" for r in results if r["available"] and r.get("run_dir")]
        which = f" (rows {', '.join(ran)})" if any(r.get("kept") for r in results) else ""
        computed = (
            f" Its {cells['runs']} runs{which} took {cells['run_seconds'] / 60:.1f} min of compute together; "
            f"they were computed at commit {made}."
        )
    else:
        computed = ""
    kept_rows = [r["row"] for r in results if r.get("kept")]
    commands = [c for c in (kept.commands if kept and kept_rows else []) if c != command] + [command]
    lines = [
        PAGE_MARK.format(table=spec.path.stem, scale=scale, commit=commit, rows=rows_measured(results)),
        f"# {spec.title}",
        "",
        "Regenerate every number on this page with:"
        if len(commands) == 1
        else "Regenerate every number on this page with these commands, in this order (each measures the "
        "rows it names; a later one keeps the rows already on the page, `--keep-page-rows`):",
        "",
        "```",
        *commands,
        "```",
        "",
        f"Page written at commit {commit}, scale **{scale}**, on {machine}; this invocation took "
        f"{wall_s / 60:.1f} min (runs already finished in the output directory are reused, not rerun)."
        f"{computed} Cells: ours as mean ± std over seeds / the paper's value / the difference.",
    ]
    own = [name for name in kept_rows if kept and name in kept.ran]  # kept rows that page measured itself
    if kept and own:
        names = ", ".join(f"`{name}`" for name in own)
        lines += ["", f"{KEPT_PARAGRAPH} at commit {kept.commit}: {names}. {kept.provenance}".rstrip()]
    if kept and kept_rows:
        for earlier in kept.earlier:  # what an earlier keeping said of rows still kept
            if any(f"`{name}`" in earlier for name in kept_rows):
                lines += ["", earlier]
    lines += ["", table.rstrip()]
    for title, rel in figures:
        lines += ["", f"![{title}]({rel})"]
    lines += ["", "## Gaps and their causes", ""]
    lines.append(
        spec.gaps.strip()
        if spec.gaps.strip()
        else "No cause has been verified for these differences yet; none is claimed."
    )
    if scale != "full":
        lines += [
            "",
            f"This page is at the **{scale}** scale ({spec.at_scale(scale).note}); differences to the paper "
            "include what that scale cut.",
        ]
    return "\n".join(lines) + "\n"


def write_page(
    spec: Spec,
    results: list[dict[str, Any]],
    page: Path,
    *,
    scale: str,
    command: str,
    commit: str,
    wall_s: float,
    kept: PageRows | None = None,
) -> Path:
    """Write ``page`` (and its figures beside it, in figures/) and refresh the index README.md there.
    With ``kept`` (rows kept from the page as it was), the new figures are named after the rows run now, so
    the kept rows' figures stay beside them."""
    from fedhet.report.provenance import machine_line

    figures = []
    fig_dir = page.parent / "figures"
    keeping = bool(kept) and any(r.get("kept") for r in results)
    ran = [Path(r["run_dir"]).name for r in results if r["available"] and r.get("run_dir")]
    tag = "-" + "+".join(dict.fromkeys(ran)) if keeping and ran else ""
    reward_table = spec.metric in REWARD_METRICS
    for title, fn, suffix in (
        ("the table's metric over rounds", metric_figure, "metric"),
        ("accuracy over rounds", accuracy_figure, "accuracy"),
        ("final rewards against standalone accuracies", rewards_figure, "rewards")
        if reward_table
        else ("final contribution weights or rewards", weights_figure, "weights"),
    ):
        made = fn(spec, results, fig_dir / f"{page.stem}-{suffix}{tag}.png")
        if made is not None:
            figures.append((title + (f" (rows {', '.join(ran)})" if tag else ""), f"figures/{made.name}"))
    if keeping:  # the kept rows' figures, where their files still are
        new = {rel for _, rel in figures}
        figures += [(t, rel) for t, rel in kept.figures if rel not in new and (page.parent / rel).is_file()]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(
        render_page(
            spec,
            results,
            scale=scale,
            command=command,
            commit=commit,
            wall_s=wall_s,
            machine=machine_line(),
            figures=figures,
            kept=kept,
        )  # fmt: skip
    )
    write_index(page.parent)
    return page


def rows_measured(results: list[dict[str, Any]]) -> str:
    """``k/n``: the rows this page holds measured (run now or kept), of those that can run here (a row left
    out with ``--rows`` counts in n; a row whose data are not here does not)."""
    ran = sum(1 for r in results if (r["available"] and r.get("run_dir")) or r.get("kept"))
    left_out = sum(1 for r in results if not r["available"] and r.get("left_out") and not r.get("kept"))
    return f"{ran}/{ran + left_out}"


# --------------------------------------------------------------------------------------------------------
# A table measured a few rows at a time: --keep-page-rows
# --------------------------------------------------------------------------------------------------------
#: How a page begins the paragraph on rows it kept from the page as it was.
KEPT_PARAGRAPH = "Rows kept from the page as it was"


@dataclass
class PageRows:
    """What a result page already holds, for the rows a new reproduction does not run (read back from the
    page as :func:`render_page` wrote it)."""

    commit: str  # the commit the page was written at
    lines: dict[str, str]  # row label (its name, and its metric where the row has its own) -> table line
    notes: dict[str, str]  # row name -> its "- row: note" line under the table
    commands: list[str]  # the page's regenerating commands
    provenance: str  # what the page said of the runs it ran ("Its N runs took ...")
    ran: list[str]  # the rows those runs measured (the rest of its measured rows it had kept itself)
    earlier: list[str]  # its own paragraphs on rows it had kept
    figures: list[tuple[str, str]]  # (title, path relative to the page)


def labelled(spec: Spec, name: str, metric: str) -> str:
    """A row's name as its table line prints it: with its metric where that is not the table's."""
    return name + (f" ({metric})" if metric != spec.metric else "")


def row_label(spec: Spec, row: Row) -> str:
    """The label ``render_markdown`` prints for ``row`` (how a kept row is found on a page)."""
    return labelled(spec, row.name, row.metric or spec.metric)


def read_page_rows(page: Path, spec: Spec, scale: str) -> PageRows:
    """The measured rows of ``page``, a result page of ``spec`` at ``scale``, with their provenance."""
    lines = page.read_text().splitlines()
    mark = _PAGE_MARK.match(lines[0]) if lines else None
    if mark is None:
        raise ConfigError(
            f"{page} is not a result page written by `fedhet reproduce --page` (its first line is not the "
            "page mark); write it without --keep-page-rows, or give another --page"
        )
    if (mark.group(1), mark.group(2)) != (spec.path.stem, scale):
        raise ConfigError(
            f"{page} holds table {mark.group(1)} at scale {mark.group(2)}, not {spec.path.stem} at {scale}: "
            "rows are kept only from a page of the same table and scale (give that page's --scale, or "
            "another --page)"
        )
    body = lines[: lines.index("## Gaps and their causes")] if "## Gaps and their causes" in lines else lines
    labels = {row_label(spec, row): row.name for row in spec.rows}
    table = {
        label: ln
        for ln in body
        for label in labels
        if ln.startswith(f"| {label} | ") and "← not run" not in ln
    }
    notes = {name: ln for ln in body for name in labels.values() if ln.startswith(f"- {name}: ")}
    fence = [i for i, ln in enumerate(body) if ln == "```"]
    commands = body[fence[0] + 1 : fence[1]] if len(fence) >= 2 else []
    written = next((ln for ln in body if ln.startswith("Page written at commit")), "")
    ran = re.search(r"(Its \d+ runs? .*?took .*?\.)(?: Cells:|$)", written)
    provenance = f"That page said of the runs it ran: {ran.group(1)}" if ran else ""
    earlier = [ln for ln in body if ln.startswith(KEPT_PARAGRAPH)]
    named = re.search(r"runs \(rows (.*?)\) took", written)
    if named:  # a page that kept rows names the rows its own runs measured
        ran_rows = re.findall(r"`([^`]+)`", named.group(1))
    else:  # an older page ran every measured row it did not keep
        kept_earlier = {name for p in earlier for name in re.findall(r"`([^`]+)`", p.split(". ")[0])}
        ran_rows = [labels[label] for label in table if labels[label] not in kept_earlier]
    figures = [
        (m.group(1), m.group(2)) for ln in body if (m := re.fullmatch(r"!\[(.*)\]\((figures/[^)]+)\)", ln))
    ]
    return PageRows(
        commit=mark.group(3),
        lines=table,
        notes=notes,
        commands=commands,
        provenance=provenance,
        ran=ran_rows,
        earlier=earlier,
        figures=figures,
    )


def keep_page_rows(spec: Spec, results: list[dict[str, Any]], kept: PageRows) -> list[dict[str, Any]]:
    """``results`` with every row this reproduction left out (``--rows``) and the page holds measured
    taken from the page: its line as printed, its note and its differences to the paper (Δ as printed)."""
    labels = {row.name: row_label(spec, row) for row in spec.rows}
    out = []
    for r in results:
        line = kept.lines.get(labels.get(r["row"], ""))
        if r.get("left_out") and line:
            diffs = [float(d) for d in re.findall(r"Δ ([+-][0-9.]+)", line)]
            r = {**r, "kept": {"line": line, "note": kept.notes.get(r["row"]), "diffs": diffs}}
        out.append(r)
    return out


def write_index(pages_dir: Path) -> Path:
    """``README.md`` of the result pages: every reproduction table, its page and scale where one exists."""
    pages = {}
    for p in sorted(pages_dir.glob("*.md")):
        if p.name == "README.md":
            continue
        head = p.read_text().split("\n", 1)[0]
        m = _PAGE_MARK.match(head)
        if m:
            some = m.group(4) is not None and m.group(4) != m.group(5)
            pages[m.group(1)] = (
                p.name,
                m.group(2) + (f" ({m.group(4)} of {m.group(5)} rows)" if some else ""),
                m.group(3),
            )
    lines = [
        "# Reproduction results",
        "",
        "One page per published table, each regenerated by the command printed on it "
        "(`fedhet reproduce NAME --scale quick|cpu|full --page docs/results/NAME.md`). `fedhet reproduce "
        "--list` lists the tables. Rows whose data are not obtainable offline are listed on each page and "
        "run for a user who passes `--set data.root=DIR`.",
        "",
        "| table | what | page | scale | commit |",
        "|---|---|---|---|---|",
    ]
    for name in list_specs():
        spec = load_spec(name)
        if name in pages:
            file, scale, commit = pages[name]
            lines.append(f"| `{name}` | {spec.title} | [{file}]({file}) | {scale} | {commit} |")
        else:
            lines.append(f"| `{name}` | {spec.title} | not measured yet | | |")
    index = pages_dir / "README.md"
    index.write_text("\n".join(lines) + "\n")
    return index
