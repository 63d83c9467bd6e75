"""tools/parity.py ``tree``: two run trees compared run by run (what a change must leave unmoved)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parity():
    spec = importlib.util.spec_from_file_location("parity", ROOT / "tools" / "parity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(path: Path, lines: list[dict], finished: bool = True) -> None:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if finished:
        (path / "summary.json").write_text("{}")


def test_tree_compares_run_by_run_with_renames_keys_and_unfinished_runs(tmp_path, capsys):
    parity = _parity()
    before, after = tmp_path / "before", tmp_path / "after"
    line = {"round": 1, "accuracy": 0.5}
    _run(before / "a" / "defaults" / "fedavg-seed0", [line])
    _run(after / "a" / "plain" / "fedavg-seed0", [line])  # read as a/defaults (renamed): identical
    _run(before / "b" / "fedavg-seed0", [{**line, "fairness_pearson": 80.0}])
    _run(after / "b" / "fedavg-seed0", [line])  # the same on the keys both hold
    _run(before / "c" / "fedavg-seed0", [line])
    _run(after / "c" / "fedavg-seed0", [{**line, "clipped": {"0": 0.5}, "accuracy": 0.4}])  # acted: apart
    _run(after / "d" / "fedavg-seed0", [line])  # no counterpart
    _run(after / "e" / "fedavg-seed0", [{"round": 1}], finished=False)  # still running: not compared
    assert parity.compare_trees(before, after, {"plain": "defaults"}, "clipped") == 0
    out = capsys.readouterr().out
    assert (
        "identical: 1; DIFFERS: 0; no counterpart: 1; holds 'clipped': 1; "
        "identical on the keys both record: 1" in out
    )
    _run(before / "f" / "fedavg-seed0", [line])
    _run(after / "f" / "fedavg-seed0", [{**line, "accuracy": 0.51}])  # a shared value moved
    assert parity.compare_trees(before, after, {"plain": "defaults"}, "clipped") == 1
    assert "differs: f/fedavg-seed0" in capsys.readouterr().out
