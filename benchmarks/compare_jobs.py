"""Parallel cells: `fedhet compare --jobs 2` against `--jobs 1` on the same comparison, wall time.

FedAvg and CELM, 2 seeds each (4 cells), Fashion-MNIST IID, 10 clients, mlp, 15 and 60 rounds on 12,000
samples, one torch thread per cell (so both settings do the same arithmetic). A straight line through the
round counts splits each setting's wall time into a fixed part (worker start-up, data loading, figures) and
a per-round part, whose ratio is the speed-up of the cells' steady state. Each setting runs in a fresh output
directory (nothing reused) as a subprocess; `--repeats` alternating pairs, median of each. Both must give the
same metrics (every cell is seeded on its own).

    python benchmarks/compare_jobs.py [--repeats 2] [--rounds 15 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import emit

ARGS = ["--methods", "fedavg,celm", "--seeds", "2", "--dataset", "fashion-mnist", "--split", "iid",
        "--clients", "10", "--model", "mlp", "--set", "data.max_train_samples=12000",
        "--set", "data.max_test_samples=2000", "--set", "eval.fairness=false", "--set", "train.threads=1",
        "--quiet", "--no-report", "--json"]  # fmt: skip


def run(jobs: int, cache: Path, rounds: int) -> tuple[float, list]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "fedhet", "compare", *ARGS, "--rounds", str(rounds), "--jobs", str(jobs)]
        cmd += ["--out", out]
        t0 = time.perf_counter()
        env = {**os.environ, "FEDHET_CACHE": str(cache)}
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        return time.perf_counter() - t0, json.loads(done.stdout.strip().splitlines()[-1])["rows"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, nargs="+", default=[15, 60])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    times: dict[tuple[int, int], list[float]] = {(r, j): [] for r in args.rounds for j in (1, 2)}
    rows: dict[tuple[int, int], list] = {}
    with tempfile.TemporaryDirectory() as cache:
        for _ in range(args.repeats):
            for rounds in args.rounds:
                for jobs in (1, 2):
                    seconds, rows[(rounds, jobs)] = run(jobs, Path(cache), rounds)
                    times[(rounds, jobs)].append(seconds)
    same = all(rows[(r, 1)] == rows[(r, 2)] for r in args.rounds)
    wall = {key: statistics.median(v) for key, v in times.items()}
    ratios = {f"jobs2_speedup_{r}_rounds": wall[(r, 1)] / wall[(r, 2)] for r in args.rounds}
    table = [{"rounds": r, "jobs": j, "wall_s": wall[(r, j)]} for r in args.rounds for j in (1, 2)]
    if len(args.rounds) > 1:
        # wall = fixed + per_round * rounds for each setting (least squares over the round counts): the
        # fixed part (worker start-up, data loading, figures) against the steady state of the cells' rounds
        for jobs in (1, 2):
            per_round, fixed = np.polyfit(args.rounds, [wall[(r, jobs)] for r in args.rounds], 1)
            ratios[f"fixed_s_jobs{jobs}"], ratios[f"per_round_s_jobs{jobs}"] = float(fixed), float(per_round)
        ratios["jobs2_per_round_speedup"] = ratios["per_round_s_jobs1"] / ratios["per_round_s_jobs2"]
    if args.json:
        emit(
            "compare_jobs",
            ratios,
            {},  # the issue asks for the measurement, not a number; two independent processes give ~1.8x here
            settings="fedhet compare, FedAvg and CELM x 2 seeds (4 cells), Fashion-MNIST IID, 10 clients, "
            f"mlp, {' and '.join(map(str, args.rounds))} rounds on 12,000 samples, one torch thread per "
            f"cell, median of {args.repeats}",
            rows=table,
            same_metrics=same,
        )
        return
    print(f"fedhet compare, 4 cells (FedAvg and CELM x 2 seeds), median of {args.repeats}:")
    for r in args.rounds:
        print(
            f"  {r} rounds: --jobs 1 {wall[(r, 1)]:.1f} s, --jobs 2 {wall[(r, 2)]:.1f} s, "
            f"speed-up {wall[(r, 1)] / wall[(r, 2)]:.2f}x"
        )
    if "jobs2_per_round_speedup" in ratios:
        print(
            f"  per round: speed-up {ratios['jobs2_per_round_speedup']:.2f}x; fixed cost "
            f"{ratios['fixed_s_jobs1']:.1f} s (jobs 1), {ratios['fixed_s_jobs2']:.1f} s (jobs 2)"
        )
    print(f"  same metrics: {same}")


if __name__ == "__main__":
    main()
