"""Flower's simulation engine against the embedded engine on a small table: wine over three sites.

The run of examples/flower-app/wine.toml (FedAvg, tabular-mlp, three Dirichlet sites) with ``--rounds``
rounds, on each engine in this process, one torch thread (the nodes use one each): the wall time of each
run, their ratio, and where the Flower run's time goes in this process (cProfile of the server side: Ray's
start-up, the exchange, the round loop; the nodes' own work runs in Ray's workers, reported by the run's
timings.jsonl). Both runs give the same metrics.jsonl (tests/test_flower.py), so the ratio is Flower's cost.

    python benchmarks/flower_table.py [--rounds 20] [--top 12] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

from common import emit

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--top", type=int, default=12, help="profile lines to print")
    parser.add_argument("--json", action="store_true", help="end with the JSON result line")
    args = parser.parse_args()

    import torch

    from fedhet.config import load_config
    from fedhet.experiment import make_simulation
    from fedhet.flower.server import run_flower_simulation

    torch.set_num_threads(1)
    cfg = load_config(ROOT / "examples" / "flower-app" / "wine.toml")
    cfg.train.rounds = args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        make_simulation(cfg, run_dir=Path(tmp) / "warm").run()  # data and code paths warm for both runs
        started = time.perf_counter()
        make_simulation(cfg, run_dir=Path(tmp) / "embedded").run()
        embedded_s = time.perf_counter() - started
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        run_flower_simulation(cfg, Path(tmp) / "flower")
        profile.disable()
        flower_s = time.perf_counter() - started
        same = (Path(tmp) / "flower" / "metrics.jsonl").read_bytes() == (
            Path(tmp) / "embedded" / "metrics.jsonl"
        ).read_bytes()
        timings = [json.loads(s) for s in (Path(tmp) / "flower" / "timings.jsonl").read_text().splitlines()]
    rounds_s = sum(t["train_s"] + t.get("eval_s", 0.0) for t in timings)
    work_s = sum(t["flower_node_work_sum_s"] for t in timings)
    print(f"wine, 3 sites, {args.rounds} rounds, FedAvg, tabular-mlp, one torch thread per process")
    print(f"embedded engine: {embedded_s:.2f} s")
    print(
        f"Flower simulation: {flower_s:.2f} s  (rounds {rounds_s:.2f} s, of which the nodes' training "
        f"{work_s:.2f} s)"
    )
    print(f"ratio Flower / embedded: {flower_s / embedded_s:.1f}x; metrics.jsonl identical: {same}")
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
    print(text.getvalue())
    if args.json:
        emit(
            "flower_table",
            {"flower_over_embedded": flower_s / embedded_s},
            {},
            settings=f"wine, 3 sites, {args.rounds} rounds, FedAvg, one torch thread",
            rows=[
                {
                    "embedded_s": embedded_s,
                    "flower_s": flower_s,
                    "flower_rounds_s": rounds_s,
                    "identical": same,
                }
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
