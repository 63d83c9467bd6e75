"""Bring cell records written under the old code digests forward to results stamps, after checking by rerun.

Until results versions, a record named the code that computed it by a digest of the bytes of every computing
file, so any edit (a comment, the TOML writer) orphaned it. This tool moves records to the results stamp of
the method at hand (``fedhet.code_version.results_stamp``), for the records whose digest is the digest of a
commit whose computing code is known to compute today's numbers:

    python tools/rekey_records.py verify --sample 1      # rerun one robustness cell per method, compare
    python tools/rekey_records.py rekey --digests D.json  # D.json: method -> the old digest at that commit
    python tools/rekey_records.py verify-table TABLE      # rerun one cell per method of a table, re-key

``verify`` reruns, at the record's seed, cells of the robustness study (one per method it holds, the
cheapest) and compares every recorded value with the rerun's: equal to the last bit on the machine kind that
recorded them (the records name it). ``rekey`` rewrites the ``code`` of each record whose old digest is
the method's digest in D.json (other records keep theirs and are listed: they need a rerun).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELLS = ROOT / "docs" / "results" / "cells"


def verify(sample: int) -> int:
    from fedhet.studies.base import run_cell
    from fedhet.studies.robustness import STUDY

    cells = {cell.path: cell for cell in STUDY.cells()}
    chosen: dict[str, list[tuple[float, Path]]] = {}
    for path in sorted((CELLS / "robustness").rglob("*-seed*.json")):
        record = json.loads(path.read_text())
        if record.get("cell") in cells:
            chosen.setdefault(record["method"], []).append((float(record.get("wall_time_s") or 0), path))
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for method, found in sorted(chosen.items()):
            for _, path in sorted(found)[:sample]:
                record = json.loads(path.read_text())
                cell = cells[record["cell"]]
                out = Path(tmp) / method
                run_cell(cell, [record["seed"]], {}, out)
                values = STUDY.record(cell, out / cell.path / f"{method}-seed{record['seed']}", method)
                same = json.loads(json.dumps(values)) == record["values"]
                failures += not same
                print(f"{'same' if same else 'DIFFERENT'}: {path.relative_to(ROOT)} ({record['commits']})")
                if not same:
                    print(f"  recorded {record['values']}\n  now      {values}")
    return 1 if failures else 0


def _same(now: object, recorded: object) -> bool:
    """A summary value against its record's (a non-finite value is kept as None): equal to the last bit."""
    if recorded is None:
        return now is None or (isinstance(now, float) and not math.isfinite(now))
    return now == recorded


def verify_table(table: str) -> int:
    """Rerun, per method, the cheapest seed-0 cell of ``table`` whose record names no stamp, compare every
    recorded view with the rerun's summary, and re-key the method's records of the same old digest when all
    agree to the last bit (same machine kind as the records name)."""
    from fedhet.engine.rundir import read_summary, run_name
    from fedhet.reproduce import load_spec, run_spec
    from fedhet.reproduce.store import method_stamp

    spec = load_spec(table)
    chosen: dict[str, tuple[float, Path, dict]] = {}
    for path in sorted((CELLS / table).rglob("*-seed0.json")):
        record = json.loads(path.read_text())
        if str(record.get("code") or "").startswith("core="):
            continue
        wall = float(record.get("wall_time_s") or 1e9)
        if record["method"] not in chosen or wall < chosen[record["method"]][0]:
            chosen[record["method"]] = (wall, path, record)
    failures = 0
    for method, (_, path, record) in sorted(chosen.items()):
        row = next(r for r in spec.rows if r.name == record["row"])
        with tempfile.TemporaryDirectory() as tmp:
            run_spec(
                spec, seeds=1, rows=[row.name], methods=[method], scale=record["scale"], out_dir=Path(tmp)
            )
            summary = read_summary(Path(tmp) / row.folder / run_name(method, 0))
        recorded = {v: k for v, k in (record.get("views") or {}).items() if k}
        same = all(
            _same(summary.get(view, {}).get(key), value)
            for view, values in recorded.items()
            for key, value in values.items()
        )
        print(
            f"{'same' if same else 'DIFFERENT'}: {path.relative_to(ROOT)} ({record['commits']})", flush=True
        )
        if not same:
            failures += 1
            continue
        moved = 0
        for other in sorted((CELLS / table).rglob(f"{method}-seed*.json")):
            rec = json.loads(other.read_text())
            if rec.get("code") == record["code"]:
                rec["code"] = method_stamp(method)
                other.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
                moved += 1
        print(f"  {moved} record(s) of {method} with digest {record['code']} moved to its stamp", flush=True)
    return 1 if failures else 0


def rekey(digests: dict[str, str]) -> int:
    from fedhet.algorithms import strategy_class
    from fedhet.code_version import results_stamp

    moved, left = 0, {}
    for path in sorted(CELLS.rglob("*-seed*.json")):
        record = json.loads(path.read_text())
        method = record["method"]
        if record.get("code") and record["code"] == digests.get(method):
            record["code"] = results_stamp(strategy_class(method))
            compact = "\n" not in path.read_text().strip()  # the studies' records are one line
            text = json.dumps(record, sort_keys=True, indent=None if compact else 1)
            path.write_text(text + "\n")
            moved += 1
        elif not str(record.get("code") or "").startswith("core="):
            key = f"{path.relative_to(CELLS).parts[0]} {method}"
            left[key] = left.get(key, 0) + 1
    print(f"{moved} records moved to results stamps; left with an old digest or none (need a rerun):")
    for key, n in sorted(left.items()):
        print(f"  {key}: {n}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--sample", type=int, default=1)
    r = sub.add_parser("rekey")
    r.add_argument("--digests", type=Path, required=True)
    t = sub.add_parser("verify-table")
    t.add_argument("table")
    args = parser.parse_args()
    if args.action == "verify":
        return verify(args.sample)
    if args.action == "verify-table":
        return verify_table(args.table)
    return rekey(json.loads(args.digests.read_text()))


if __name__ == "__main__":
    sys.exit(main())
