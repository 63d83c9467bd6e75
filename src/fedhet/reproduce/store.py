"""The record store: one small JSON record per finished (cell, method, seed), kept beside its result page.

Runs are scratch; records are committed, so a table or study fills across sessions and every page is rendered
from them. ``fedhet reproduce`` keeps its records under ``docs/results/cells/<table>/<scale>/<row>/`` (the
run's summary views), the studies under ``docs/results/cells/<study>/<cell>/`` (the values their tables read);
the file is ``<method>-seed<k>.json`` and every record holds the same provenance besides its values:

- ``experiment``: the run's experiment fingerprint (``ExperimentConfig.run_fingerprint``);
- ``code``: the results stamp the run computed under (``fedhet.code_version.results_stamp``: the versions of
  the core and of every ``fedhet.algorithms`` module the method reaches), or None when its rounds ran under
  several stamps, or before stamps existed;
- ``method``, ``seed``, ``commits`` (every commit its rounds ran at), ``wall_time_s`` and ``machine``.

One rule decides when a record stands for a run (:func:`is_reusable`): the same experiment, and the stamp of
the code at hand. Comments, refactors, new keys with a neutral default, new methods or attacks change neither;
a change of what a module computes bumps its version and reruns exactly the methods that reach it
(docs/reliability.md, "When a record is reused").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedhet.engine.rundir import run_name


def method_stamp(method: str) -> str | None:
    """The results stamp of ``method`` in the code at hand (None for a method outside fedhet, or one no longer
    registered: no record of it is reused)."""
    from fedhet.algorithms import strategy_class
    from fedhet.code_version import results_stamp
    from fedhet.errors import ConfigError

    try:
        return results_stamp(strategy_class(method))
    except ConfigError:
        return None


def run_stamp(summary: dict[str, Any]) -> str | None:
    """The stamp a finished run computed under: the one every stretch of its rounds names, else None."""
    stamps = {stretch.get("results") for stretch in summary.get("fedhet_commits") or [{}]}
    return stamps.pop() if len(stamps) == 1 else None


def is_reusable(record: dict[str, Any] | None, fingerprint: str, method: str) -> bool:
    """Whether ``record`` stands for a run of ``method`` whose experiment fingerprint is ``fingerprint``: the
    same experiment, computed under the results stamp of the code at hand."""
    if not record:
        return False
    stamp = method_stamp(method)
    return record.get("experiment") == fingerprint and stamp is not None and record.get("code") == stamp


def record_path(folder: Path, method: str, seed: int) -> Path:
    return folder / f"{run_name(method, seed)}.json"


def read_record(path: Path) -> dict[str, Any] | None:
    """A record, or None where there is none (or it cannot be read)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def provenance(summary: dict[str, Any], *, experiment: str | None, machine: str) -> dict[str, Any]:
    """What every record holds about the run behind it (see the module docstring), from its summary."""
    commits = [c["commit"] for c in summary.get("fedhet_commits") or [] if c.get("commit")]
    return {
        "experiment": experiment,
        "code": run_stamp(summary),
        "commits": commits or [summary.get("fedhet_commit")],
        "wall_time_s": summary.get("wall_time_s"),
        "machine": machine,
    }


def write_record(path: Path, record: dict[str, Any], *, compact: bool = False) -> Path:
    """Write ``record`` to ``path`` (sorted keys; ``compact``: one line, as the studies keep theirs), unless
    the record there holds the same run with a stamp and this one has none (a run of stretches at several
    commits written again by a later checkout): the stamp it was recorded with is kept."""
    old = read_record(path)
    same_run = old is not None and (old.get("experiment"), old.get("commits")) == (
        record.get("experiment"),
        record.get("commits"),
    )
    if same_run and old.get("code") and not record.get("code"):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, sort_keys=True) if compact else json.dumps(record, indent=1, sort_keys=True)
    path.write_text(text + "\n")
    return path
