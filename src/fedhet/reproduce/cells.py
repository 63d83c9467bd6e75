"""Cell records: one small JSON file per finished (row, method, seed) of a table, kept beside its result page.

A result page keeps rows measured in earlier sessions (``--keep-page-rows``), but their runs are gone; their
records stay (``docs/results/cells/<table>/<scale>/<row>/<method>-seed<k>.json``), so a page's findings are
judged from every seed ever measured for it, not only from this session's. A record holds the run's summary
views (final, best, last 10 rounds, last 100 evaluations) of every scalar metric, its rounds, clients and
model, the commits that computed it, its wall time and the command that made it.

A record also holds what made its number: the run's experiment fingerprint and a digest of the code that
computes a cell of its method (:func:`code_digest`). ``fedhet reproduce --page`` takes a cell whose record
matches both from the record instead of running it again (:func:`recorded_summaries`), so a long table
fills across sessions; a change to the method's code, or to the engine, data or models, runs it again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from fedhet.code_version import PACKAGE
from fedhet.comparison import VIEW_KEYS
from fedhet.config import ExperimentConfig, load_run_config
from fedhet.reproduce.spec import Spec

#: Parts of the package that cannot change a cell's numbers: the commands, the tables and pages, the
#: studies, the reports and verdicts, and the Flower adapter (its runs equal the embedded engine's, tested).
NOT_COMPUTING = ("cli", "reproduce", "studies", "report", "flower", "api.py", "__main__.py", "verdicts.py")


def method_code_files(method: str) -> list[Path]:
    """The source files that compute a cell of ``method``: every module of the package outside
    :data:`NOT_COMPUTING` and ``algorithms/``, and of ``algorithms/`` the registry, the modules of the
    method's strategy and trainer class hierarchies and what they import from ``fedhet.algorithms``."""
    import inspect

    from fedhet.algorithms import strategy_class

    cls = strategy_class(method)
    classes = [*cls.__mro__, *getattr(cls, "trainer_class", object).__mro__]
    todo = [Path(inspect.getsourcefile(c)) for c in classes if c.__module__.startswith("fedhet.algorithms")]
    algorithms = PACKAGE / "algorithms"
    reached = {algorithms / "__init__.py"}
    while todo:
        path = todo.pop()
        if path in reached:
            continue
        reached.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedhet.algorithms."):
                todo.append(algorithms / (node.module.split(".")[2] + ".py"))
    others = [
        p
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0] not in (*NOT_COMPUTING, "algorithms")
    ]
    return sorted(reached | set(others))


@cache
def code_digest(method: str) -> str:
    """A short sha256 of :func:`method_code_files` (paths and contents)."""
    h = hashlib.sha256()
    for path in method_code_files(method):
        h.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


VIEWS = tuple(VIEW_KEYS)  # every summary view a table may show


def record_dir(cells_dir: Path, spec: Spec, scale: str, row_folder: str) -> Path:
    return cells_dir / spec.path.stem / scale / row_folder


def _scalars(view: dict[str, Any] | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, value in (view or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float | type(None)):
            continue
        out[key] = None if value is None or not math.isfinite(value) else float(value)
    return out


def write_records(
    spec: Spec, results: list[dict[str, Any]], cells_dir: Path, *, scale: str, command: str, machine: str
) -> list[Path]:
    """A record per run of the rows that ran now (read from their summary.json); returns the files written."""
    written = []
    folders = {row.name: row.folder for row in spec.rows}
    for r in results:
        if not (r["available"] and r.get("run_dir")) or r.get("kept"):
            continue
        target = record_dir(cells_dir, spec, scale, folders.get(r["row"], r["row"]))
        for method in r["methods"]:
            for seed in r["seeds"]:
                run = Path(r["run_dir"]) / f"{method}-seed{seed}"
                shape = {key: r.get(key) for key in ("rounds", "clients", "model")}
                path = write_record(
                    spec, target, run, r["row"], method, seed, scale=scale, command=command, machine=machine,
                    **shape,
                )  # fmt: skip
                if path is not None:
                    written.append(path)
    return written


def write_record(
    spec: Spec,
    target: Path,
    run: Path,
    row: str,
    method: str,
    seed: int,
    *,
    scale: str,
    command: str,
    machine: str,
    rounds: int | None,
    clients: int | None,
    model: str | None,
) -> Path | None:
    """The record of one finished run (``run``: its ``<method>-seed<k>`` folder) in the folder ``target``;
    None when the run has not finished."""
    source = run / "summary.json"
    if not source.is_file():
        return None
    summary = json.loads(source.read_text())
    config = run / "config.toml"
    record = {
        # what made the number: taken again from here only while both still hold
        "experiment": load_run_config(config).run_fingerprint() if config.is_file() else None,
        "code": code_digest(method) if computed_by_this_code(summary, method) else None,
        "table": spec.path.stem,
        "scale": scale,
        "row": row,
        "method": method,
        "seed": seed,
        "views": {view: _scalars(summary.get(view)) for view in VIEWS},
        "rounds": rounds,
        "clients": clients,
        "model": model,
        "commits": [c["commit"] for c in summary.get("fedhet_commits") or [] if c.get("commit")]
        or [summary.get("fedhet_commit")],
        "wall_time_s": summary.get("wall_time_s"),
        "command": command,
        "machine": machine,
    }
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{method}-seed{seed}.json"
    if record["code"] is None and vouched_for(path, record):
        return path  # a checkout whose code computed this run wrote it: kept as it is
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def computed_by_this_code(summary: dict[str, Any], method: str) -> bool:
    """Whether the run's numbers come from the code here: every commit its rounds were computed at is clean
    and holds the same :func:`method_code_files` as this checkout, which has no uncommitted change in them
    (``git diff``; False outside a git checkout)."""
    stretches = summary.get("fedhet_commits") or [{"commit": summary.get("fedhet_commit")}]
    commits = {str(c.get("commit")) for c in stretches}
    if not commits or any(not c or c == "None" or " " in c or c == "unknown" for c in commits):
        return False  # not recorded, or computed with uncommitted changes
    files = [str(p) for p in method_code_files(method)]
    for against in (*sorted(commits), None):  # each run commit against HEAD, then HEAD against the tree
        command = ["git", "diff", "--quiet", *([against, "HEAD"] if against else ["HEAD"]), "--", *files]
        try:
            if subprocess.run(command, cwd=PACKAGE, capture_output=True).returncode != 0:
                return False
        except OSError:
            return False
    return True


def recorded_summaries(
    cells_dir: Path, spec: Spec, scale: str, row_folder: str, configs: Sequence[ExperimentConfig]
) -> dict[tuple[str, int], dict[str, Any]]:
    """(method, seed) -> a summary rebuilt from its record, for each of ``configs`` (one per method and seed,
    as the run would have it) whose record holds the same experiment and the same code digest."""
    out = {}
    folder = record_dir(cells_dir, spec, scale, row_folder)
    for cfg in configs:
        method, seed = cfg.method.name, cfg.seed
        path = folder / f"{method}-seed{seed}.json"
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        if record.get("experiment") != cfg.run_fingerprint() or record.get("code") != code_digest(method):
            continue
        views = record.get("views") or {}
        out[method, seed] = {
            "seed": seed,
            **{view: dict(views.get(view) or {}) for view in VIEWS},
            "wall_time_s": record.get("wall_time_s"),
            "fedhet_commits": [{"commit": c} for c in record.get("commits") or []],
            "from_record": str(path),
        }
    return out


def vouched_for(path: Path, record: dict[str, Any]) -> bool:
    """Whether ``path`` already holds ``record``'s run (same experiment and commits) with a code digest: the
    page was written again by a checkout whose code has moved on, which cannot vouch for the run, but the one
    that wrote the record could."""
    if not path.is_file():
        return False
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    same_run = (old.get("experiment"), old.get("commits")) == (record["experiment"], record["commits"])
    return bool(old.get("code")) and same_run


def fill_from_records(spec: Spec, results: list[dict[str, Any]], cells_dir: Path, *, scale: str) -> None:
    """Per-seed values, from the records, for the rows of ``results`` that did not run now (kept rows). A row
    is found by its identity (name, metric and view), never by its name alone: rows may share a name."""
    rows = {spec.row_key(row): row for row in spec.rows}
    for r in results:
        row = rows.get(spec.result_key(r))
        if row is None or (r["available"] and r.get("run_dir")):
            continue
        folder = record_dir(cells_dir, spec, scale, row.folder)
        metric = r.get("metric") or spec.metric
        view = r.get("view") or row.view or spec.view
        factor = row.scale if row.scale is not None else spec.scale
        for method, values in r["methods"].items():
            per_seed = {}
            for path in sorted(folder.glob(f"{method}-seed*.json")):
                record = json.loads(path.read_text())
                value = (record.get("views", {}).get(view) or {}).get(metric)
                per_seed[str(record["seed"])] = None if value is None else factor * value
            if per_seed:
                values["per_seed"] = per_seed
