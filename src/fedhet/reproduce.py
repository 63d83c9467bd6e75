"""Reproduce a published table: run its rows with fedhet and print our numbers beside the paper's.

A table is a TOML file (``configs/reproduce/*.toml``)::

    title = "CELM Table 1 (Fashion-MNIST): global-model test accuracy"
    source = "paper-results.md, CELM Table 1"
    metric = "accuracy"          # a metric of summary.json
    view = "final"               # final | best | last
    scale = 100                  # display scale (accuracies in %)
    seeds = 3
    methods = ["fedavg", "celm"]

    [method_params]                              # optional: parameters of one method in every row
    shapfed = { protocol = "global" }

    [[rows]]
    name = "Dir 0.05"
    config = "../celm/fmnist-dir0.05.toml"      # relative to this file
    set = ["data.validation_fraction=0.1"]      # optional overrides
    paper = { fedavg = "81.63 ± 2.69", celm = "83.64 ± 0.42" }

    [[rows]]
    name = "FedISIC natural"
    available = false                            # data not obtainable offline: listed, not run
    note = "FedISIC is not obtainable offline"
    paper = { fedavg = "61.25 ± 0.04" }

Every printed table says how many rounds and seeds were used, so a reduced-scale run is never mistaken for a
full reproduction.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
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
    }
    bad = set(raw) - known
    if bad:
        raise ConfigError(f"{path}: unknown key(s) {sorted(bad)}; accepted: {sorted(known)}")
    if raw.get("view", "final") not in ("final", "best", "last"):
        raise ConfigError(f"{path}: view={raw.get('view')!r}; accepted: 'final', 'best', 'last'")
    rows = []
    for i, r in enumerate(raw.get("rows", [])):
        unknown = set(r) - {"name", "config", "set", "paper", "available", "note", "metric", "method_params"}
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
            )
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
    )


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


def row_config(row: Row, overrides: list[str]) -> ExperimentConfig:
    cfg = load_config(row.config)
    for key, value in parse_set_args(row.overrides + overrides):
        apply_override(cfg, key, value)
    return cfg


def run_spec(
    spec: Spec,
    *,
    seeds: int | None = None,
    overrides: list[str] | None = None,
    rows: str | None = None,
    methods: list[str] | None = None,
    out_dir: Path,
    progress=None,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """Run the selected rows; one result dict per row with our mean/std and the paper's value per method.

    Runs already finished in ``out_dir`` are reused (see :func:`fedhet.comparison.run_comparison`).
    """
    from fedhet.comparison import VIEW_KEYS, aggregate_rows, run_comparison

    n_seeds = seeds or spec.seeds
    results = []
    done: dict[tuple, tuple[dict[str, Any], Path]] = {}  # rows that share their runs (e.g. two metrics)
    for row in spec.rows:
        if rows and rows.lower() not in row.name.lower():
            continue
        wanted = [m for m in (methods or spec.methods)]
        entry: dict[str, Any] = {"row": row.name, "available": row.available, "note": row.note, "methods": {}}
        if not row.available:
            for m in wanted:
                entry["methods"][m] = {"paper": row.paper.get(m)}
            results.append(entry)
            continue
        base = row_config(row, overrides or [])
        missing = _data_missing(base)
        if missing:
            entry.update(available=False, note=missing)
            for m in wanted:
                entry["methods"][m] = {"paper": row.paper.get(m)}
            results.append(entry)
            continue
        seed_list = [base.seed + i for i in range(n_seeds)]
        params = {m: {**spec.method_params.get(m, {}), **row.method_params.get(m, {})} for m in wanted}
        key = (base.fingerprint(), tuple(wanted), tuple(seed_list), json.dumps(params, sort_keys=True))
        if key not in done:
            slug = re.sub(r"[^A-Za-z0-9.]+", "-", row.name).strip("-").lower()
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
                "run_dir": str(run_dir),
            }
        )
        key_mean, key_std = VIEW_KEYS[spec.view]
        metric = row.metric or spec.metric
        entry["metric"] = metric
        for m in wanted:
            mean = agg[m][key_mean].get(metric)
            std = agg[m][key_std].get(metric)
            entry["methods"][m] = {
                "ours": None if mean is None else spec.scale * mean,
                "ours_std": None if std is None else spec.scale * std,
                "paper": row.paper.get(m),
            }
        results.append(entry)
    return results


def _cell(v: dict[str, Any]) -> str:
    ours, paper = v.get("ours"), v.get("paper")
    parts = []
    if ours is not None and math.isfinite(ours):
        parts.append(f"**{ours:.2f} ± {v.get('ours_std') or 0:.2f}**")
    else:
        parts.append("—")
    if paper is not None:
        p, ps = paper
        parts.append(f"paper {p:.2f}" + (f" ± {ps:.2f}" if ps is not None else ""))
        if ours is not None and math.isfinite(ours):
            parts.append(f"Δ {ours - p:+.2f}")
    return " / ".join(parts)


def render_markdown(spec: Spec, results: list[dict[str, Any]]) -> str:
    """A Markdown table: one row per table row, a cell per method with ours / paper / difference."""
    methods = sorted({m for r in results for m in r["methods"]}, key=lambda m: (spec.methods + [m]).index(m))
    lines = [f"## {spec.title}", ""]
    if spec.source:
        lines += [f"Source: {spec.source}. Metric: `{spec.metric}` ({spec.view}), ×{spec.scale:g}.", ""]
    lines += [
        "| row | rounds | seeds | " + " | ".join(methods) + " |",
        "|---|---|---|" + "---|" * len(methods),
    ]
    for r in results:
        if not r["available"]:
            cells = [
                (f"paper {v['paper'][0]:.2f}" if v.get("paper") else "—")
                for v in (r["methods"].get(m, {}) for m in methods)
            ]
            lines.append(f"| {r['row']} | — | — | " + " | ".join(cells) + f" |  ← not run: {r['note']}")
            continue
        cells = [_cell(r["methods"].get(m, {})) for m in methods]
        name = r["row"] + (f" ({r['metric']})" if r.get("metric") and r["metric"] != spec.metric else "")
        lines.append(f"| {name} | {r['rounds']} | {len(r['seeds'])} | " + " | ".join(cells) + " |")
    if spec.notes:
        lines += ["", spec.notes.strip()]
    diffs = [
        v["ours"] - v["paper"][0]
        for r in results
        for v in r["methods"].values()
        if r["available"] and v.get("paper") and v.get("ours") is not None and math.isfinite(v["ours"])
    ]
    if diffs:
        lines += ["", f"Mean |Δ| over {len(diffs)} cells: {np.mean(np.abs(diffs)):.2f}."]
    return "\n".join(lines) + "\n"


def write_results(spec: Spec, results: list[dict[str, Any]], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "reproduce.json").write_text(
        json.dumps({"spec": str(spec.path), "title": spec.title, "results": results}, indent=2, default=str)
    )
    md = out_dir / "reproduce.md"
    md.write_text(render_markdown(spec, results))
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
                    }
                )
    return path
