"""The table definitions of `fedhet reproduce`: a published table's rows, methods, scales and paper values.

A table is a TOML file (``configs/reproduce/*.toml``)::

    title = "CELM Table 1 (Fashion-MNIST): global-model test accuracy"
    source = "paper-results.md, CELM Table 1"
    metric = "accuracy"          # a metric of summary.json
    view = "final"               # final | best | last (last 10 rounds) | last_100 (last 100 evaluations)
    scale = 100                  # display scale (accuracies in %)
    seeds = 3
    methods = ["fedavg", "celm"]
    set = ["guards.update_norm_clip=0"]          # optional: overrides of every row, before the row's own
    gaps = '''Differences to the paper and their verified causes (shown on the result page).'''

    [[claims]]                                   # optional: the paper's findings, judged from the cells
    text = "CELM is more accurate than FedAvg"   # (fedhet.reproduce.claims: paired by seed, 95 % interval)
    better = "celm"
    than = "fedavg"
    rows = ["Dir"]                               # optional: rows whose name contains one of these

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

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError
from fedhet.reproduce.claims import Claim, load_claims

SPEC_DIR = Path(__file__).resolve().parents[1] / "configs" / "reproduce"  # package data
_PM = re.compile(r"^\s*(-?[\d.]+)\s*(?:±|\+-|\+/-)\s*([\d.]+)\s*$")


@dataclass
class Row:
    """One row of a table: its config, overrides and the paper's value per method."""

    name: str
    config: Path | None
    overrides: list[str] = field(default_factory=list)
    paper: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    available: bool = True
    note: str = ""
    metric: str | None = None  # overrides the table's metric for this row
    view: str | None = None  # overrides the table's view (final / best / last / last_100) for this row
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
    """A published table as a TOML file defines it (the format is in this module's docstring)."""

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
    #: The paper's findings as data; their verdicts are computed from the cells (fedhet.reproduce.claims).
    claims: list[Claim] = field(default_factory=list)
    #: Overrides of every row (``set`` at the top of the table), already at the head of each row's own.
    overrides: list[str] = field(default_factory=list)

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

    def row_key(self, row: Row) -> tuple[str, str, str]:
        """A row's identity on its page: its name, metric and view. Rows may share a name (one row per metric
        or view of the same runs); no two rows of a table share all three."""
        return row.name, row.metric or self.metric, row.view or self.view

    def result_key(self, result: dict[str, Any]) -> tuple[str, str, str]:
        """The identity (:meth:`row_key`) of a result row (one dict of :func:`~fedhet.reproduce.run_spec`)."""
        return result["row"], result.get("metric") or self.metric, result.get("view") or self.view


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
    """The names of the shipped tables (configs/reproduce/*.toml), sorted."""
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml")) if SPEC_DIR.is_dir() else []


ROW_KEYS = {
    "name",
    "config",
    "set",
    "paper",
    "available",
    "note",
    "metric",
    "view",
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
    """The table ``name`` (a shipped table's name or a path), every key checked."""
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
        "claims",
        "set",
    }
    bad = set(raw) - known
    if bad:
        raise ConfigError(f"{path}: unknown key(s) {sorted(bad)}; accepted: {sorted(known)}")
    if raw.get("gates", "") not in GATES:
        raise ConfigError(f"{path}: gates={raw.get('gates')!r}; accepted: {', '.join(map(repr, GATES))}")
    from fedhet.comparison import VIEW_KEYS

    for where, item in [
        ("", raw),
        *((f" row {r.get('name', i)!r}", r) for i, r in enumerate(raw.get("rows", []))),
    ]:
        if item.get("view", "final") not in VIEW_KEYS:
            accepted = ", ".join(map(repr, VIEW_KEYS))
            raise ConfigError(f"{path}:{where} view={item.get('view')!r}; accepted: {accepted}")
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
                overrides=[*raw.get("set", []), *r.get("set", [])],
                paper={m: parse_paper_value(v) for m, v in r.get("paper", {}).items()},
                available=available,
                note=r.get("note", ""),
                method_params=_method_params(path, r.get("method_params", {})),
                methods=list(r.get("methods", [])),
                metric=r.get("metric"),
                view=r.get("view"),
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
    seen: set[tuple[str, str | None, str | None]] = set()
    for row in rows:  # a page tells its rows apart by name, metric and view (fedhet.reproduce.page)
        key = (row.name, row.metric or raw.get("metric", "accuracy"), row.view or raw.get("view", "final"))
        if key in seen:
            raise ConfigError(
                f"{path}: two rows are named {row.name!r} with the same metric and view; rows that share a "
                "name must differ in `metric` or `view`"
            )
        seen.add(key)
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
        claims=load_claims(path, raw.get("claims"), list(raw.get("methods", []))),
        overrides=list(raw.get("set", [])),
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
