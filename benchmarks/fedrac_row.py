"""One full FedRAC table row: its 6 methods x seeds x rounds, every round evaluated, with the reward models
evaluated one at a time and stacked in one batched pass, in one run.

A FedRAC fairness row (default: fedrac-fairness-substitute, Fashion-MNIST DIR(3.0), as the table's page ran
it: ``--set engine.mode=vectorized``, 10 clients, mlp200, eval.every = 1) is run cell by cell in this process
(one torch thread, as each worker of ``fedhet reproduce --jobs 2`` runs). Every cell runs twice, once with
the own-model methods' reward models evaluated one at a time and once stacked (``torch.func.vmap``; the
private switch ``fedhet.engine.evaluation._BATCHED_STATES``), in alternating order so both see the same load;
FedRAC and FedSAC evaluate their masked rewards in their own batched pass in both. The standalone pre-pass
(the fairness reference, cached per seed and shared by the row's cells) runs once before and is not counted.

The full row (2,000 rounds x 3 seeds) is extrapolated from the measured rounds: per cell, its fixed part
(set-up, data, the end-of-run figures: wall time minus the rounds' time) plus its mean round time x 2,000,
summed over the methods and scaled to 3 seeds. That sum is the compute of the row (what a table page reports
as "took N min of compute together"); with ``--jobs 2`` on 2 otherwise idle cores the wall time is about half.

    python benchmarks/fedrac_row.py [--rounds 30] [--seeds 1] [--row "DIR(3.0)"] [--json]

``--floor`` measures instead what no implementation on this CPU can go below: the floating-point operations
of one round of each method (torch's ``FlopCounterMode`` over a few rounds: training, scoring and evaluation,
every matrix product the round runs), times the full row's rounds and seeds, divided by the rate this machine
reaches on one thread for the evaluation's own matrix product (1,000 test images x 784 -> 200, the largest
layer, best of 400 timings). That quotient is the row's compute at the machine's peak with nothing but
arithmetic; half of it is the wall time on 2 cores.

    python benchmarks/fedrac_row.py --floor-only [--rounds 3]   (or --floor beside the timing)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from common import emit

import fedhet.engine.evaluation as evaluation
from fedhet.experiment import make_simulation, standalone_accuracies
from fedhet.reproduce.runner import row_config
from fedhet.reproduce.spec import load_spec

FULL_ROUNDS, FULL_SEEDS = 2000, 3
#: the row's methods as its page measured them (BEFORE_MIN); later tables may add methods
ROW_METHODS = ["fedavg", "cffl", "iafl", "fedsac", "fedrac", "fedrac-strict"]
BEFORE_MIN = 242.5  # the DIR(3.0) row's 18 runs at 2,000 rounds (docs/results/fedrac-fairness-substitute.md)
TARGET_MIN = 60.0


def run_cell(cfg, reference, run_dir: Path, batched: bool) -> tuple[float, float]:
    """(wall seconds of the cell, seconds of its rounds) with the reward evaluation stacked or not."""
    evaluation._BATCHED_STATES = batched
    start = time.perf_counter()
    sim = make_simulation(cfg, run_dir=run_dir, reference_contributions=reference)
    sim.run()
    wall = time.perf_counter() - start
    rounds = sum(t["train_s"] + t.get("eval_s", 0.0) for t in sim.timings)
    return wall, rounds


def extrapolated_min(cells: list[dict], key: str, rounds: int, seeds: int) -> float:
    """The full row's compute in minutes: per cell fixed part + mean round time x FULL_ROUNDS, x seeds."""
    total = 0.0
    for c in cells:
        fixed = c[f"{key}_wall_s"] - c[f"{key}_rounds_s"]
        total += fixed + c[f"{key}_rounds_s"] / rounds * FULL_ROUNDS
    return total / seeds * FULL_SEEDS / 60.0


def matmul_rate_gflops(rows: int = 1_000, repeats: int = 400) -> float:
    """The best rate (GFLOP/s) of the evaluation's largest product on this machine's current threads:
    ``rows`` test images x 784 inputs times a 784 x 200 weight (mlp200's first layer). Short products timed
    many times: the best of them is the rate of a core that ran undisturbed, even beside other jobs."""
    x, w = torch.randn(rows, 784), torch.randn(784, 200)
    torch.mm(x, w)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(x, w)
        best = min(best, time.perf_counter() - start)
    return 2 * rows * 784 * 200 / best / 1e9


def round_flops(cfg, reference, run_dir: Path) -> float:
    """Floating-point operations per round of ``cfg`` (every torch product its rounds run)."""
    from torch.utils.flop_counter import FlopCounterMode

    sim = make_simulation(cfg, run_dir=run_dir, reference_contributions=reference)
    with FlopCounterMode(display=False) as counter:
        sim.run()
    return counter.get_total_flops() / cfg.train.rounds


def floor(row, sets: list[str], methods: list[str], seed: int) -> dict:
    """Print and return the row's arithmetic floor (see the module docstring)."""
    rate = matmul_rate_gflops()
    total = 0.0
    per_round: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FEDHET_CACHE"] = str(Path(tmp) / "cache")
        seeded = row_config(row, ["eval.every=1", *sets, f"seed={seed}"])
        reference = standalone_accuracies(seeded, notify=lambda _: None, reason="benchmark")
        for method in methods:
            cfg = row_config(row, ["eval.every=1", *sets, f"seed={seed}", f"method.name={method}"])
            flops = round_flops(cfg, reference, Path(tmp) / method)
            per_round[method] = flops / 1e9
            cell_min = flops * FULL_ROUNDS / (rate * 1e9) / 60
            total += cell_min * FULL_SEEDS
            gflop = f"{flops / 1e9:8.1f} GFLOP per round"
            print(f"  {method:14s} {gflop} -> {cell_min:6.1f} min per 2,000-round cell")
    print(f"peak matrix-product rate, one thread: {rate:.1f} GFLOP/s")
    print(
        f"ARITHMETIC FLOOR of the row ({len(methods)} methods x {FULL_SEEDS} seeds x {FULL_ROUNDS} rounds): ",
        end="",
    )
    print(f"{total:.1f} min of compute, {total / 2:.1f} min of wall time on 2 cores (target {TARGET_MIN:g})")
    return {
        "floor_gflop_per_round": {m: round(v, 2) for m, v in per_round.items()},
        "floor_matmul_gflops": round(rate, 1),
        "floor_compute_min": round(total, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="fedrac-fairness-substitute")
    parser.add_argument("--row", default="DIR(3.0)", help="text the row's name contains (first match)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", default=",".join(ROW_METHODS), help="comma-separated")
    parser.add_argument("--json", action="store_true", help="end with the JSON result line")
    parser.add_argument("--floor", action="store_true", help="also measure the row's arithmetic floor")
    parser.add_argument("--floor-only", action="store_true", help="measure only the arithmetic floor")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")

    spec = load_spec(args.table)
    row = next(r for r in spec.rows if r.available and args.row.lower() in r.name.lower())
    sets = [f"train.rounds={args.rounds}", f"train.threads={args.threads}", "engine.mode=vectorized"]
    base = row_config(row, ["eval.every=1", *sets])
    if args.floor_only:
        print(f"{args.table}: row {row.name!r}, methods {', '.join(methods)}; {args.rounds} rounds counted")
        floor(row, sets, methods, base.seed)
        return
    print(f"{args.table}: row {row.name!r}, methods {', '.join(methods)}; ", end="")
    print(f"{args.rounds} rounds x {args.seeds} seed(s), every round evaluated, ", end="")
    print(f"{args.threads} torch thread(s), one cell at a time")
    cells: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FEDHET_CACHE"] = str(Path(tmp) / "cache")  # a fresh pre-pass cache, not the user's
        prepass_s = 0.0
        for seed_index in range(args.seeds):
            seed = base.seed + seed_index
            start = time.perf_counter()
            seeded = row_config(row, ["eval.every=1", *sets, f"seed={seed}"])
            reference = standalone_accuracies(seeded, notify=lambda _: None, reason="benchmark")
            prepass_s += time.perf_counter() - start
            for n, method in enumerate(methods):
                params = {**spec.method_params.get(method, {}), **row.method_params.get(method, {})}
                sets_m = [f"seed={seed}", f"method.name={method}"]
                cfg = row_config(row, ["eval.every=1", *sets, *sets_m])
                cfg.method.params = params
                out = {"method": method, "seed": seed}
                order = (False, True) if n % 2 == 0 else (True, False)  # alternate who goes first
                for batched in order:
                    key = "stacked" if batched else "one_at_a_time"
                    wall, rounds = run_cell(cfg, reference, Path(tmp) / f"{method}-{seed}-{key}", batched)
                    out[f"{key}_wall_s"], out[f"{key}_rounds_s"] = wall, rounds
                out["ratio"] = out["one_at_a_time_wall_s"] / out["stacked_wall_s"]
                cells.append(out)
                print(
                    f"  {method:14s} seed {seed}: one at a time {out['one_at_a_time_wall_s']:7.1f} s, "
                    f"stacked {out['stacked_wall_s']:7.1f} s, ratio {out['ratio']:.3f}",
                    flush=True,
                )
    evaluation._BATCHED_STATES = None
    old = sum(c["one_at_a_time_wall_s"] for c in cells)
    new = sum(c["stacked_wall_s"] for c in cells)
    old_full = extrapolated_min(cells, "one_at_a_time", args.rounds, args.seeds)
    new_full = extrapolated_min(cells, "stacked", args.rounds, args.seeds)
    print(f"measured row ({args.rounds} rounds x {args.seeds} seed(s)): one at a time {old:.1f} s, ", end="")
    print(f"stacked {new:.1f} s: one-at-a-time / stacked = {old / new:.3f}")
    print(f"standalone pre-pass (not counted): {prepass_s:.1f} s")
    print(f"EXTRAPOLATED from {args.rounds} measured rounds to the full row ", end="")
    print(f"({FULL_ROUNDS} rounds x {FULL_SEEDS} seeds, summed compute): ", end="")
    print(f"one at a time {old_full:.1f} min, stacked {new_full:.1f} min")
    print(f"  (the page's measured row: {BEFORE_MIN} min of compute on an idle machine; ", end="")
    print(f"target {TARGET_MIN:g} min; with --jobs 2 the wall time is about half the compute: ", end="")
    print(f"{old_full / 2:.1f} / {new_full / 2:.1f} min)")
    floor_result = {}
    if args.floor:
        print("the row's arithmetic floor (FLOPs counted over 3 rounds):")
        floor_sets = [s for s in sets if not s.startswith("train.rounds=")] + ["train.rounds=3"]
        floor_result = floor(row, floor_sets, methods, base.seed)
    ratios = {
        "one_at_a_time_over_stacked": old / new,
        "row_minutes_extrapolated_one_at_a_time": old_full,
        "row_minutes_extrapolated_stacked": new_full,
    }
    targets = {"row_minutes_extrapolated_stacked": f"<= {TARGET_MIN:g}"}
    if floor_result:  # the least any implementation needs on this CPU, as wall time on 2 cores
        ratios["row_minutes_arithmetic_floor_2_cores"] = floor_result["floor_compute_min"] / 2
        targets["row_minutes_arithmetic_floor_2_cores"] = f"<= {TARGET_MIN:g}"
    if args.json:
        emit(
            "fedrac_row",
            ratios,
            targets,
            settings=f"{args.table} row {row.name}, {len(methods)} methods x {args.seeds} seed(s) x "
            f"{args.rounds} rounds, every round evaluated, {args.threads} thread(s), cells one at a time, "
            f"each run with both reward evaluations in alternating order; the full row ({FULL_ROUNDS} rounds "
            f"x "
            f"{FULL_SEEDS} seeds) extrapolated from the measured rounds",
            rows=[{k: (round(v, 3) if isinstance(v, float) else v) for k, v in c.items()} for c in cells],
            prepass_s=prepass_s,
            **floor_result,
        )


if __name__ == "__main__":
    main()
