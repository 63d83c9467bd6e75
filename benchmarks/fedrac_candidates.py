"""FedRAC's hot spot: evaluating the K/step candidate submodels on the validation set every round.

Runs FedRAC for a few rounds on a real configuration (default: Fashion-MNIST CLA, mlp200, 10 clients,
6,000 validation images, 50 candidates), then times, on the trained global model and the round's unit
order, (a) the batched evaluation FedRAC uses (``masked_accuracies``: one pass over the validation set
sharing the nested prefixes), (b) ``masked_logits`` batch by batch (the generic batched path) and (c) the
per-mask loop of the reference code (set the mask, evaluate, repeat). It prints the speed-ups, the largest
accuracy difference between the paths in validation samples (different kernels: an argmax may flip on a
near-tie, so 0 is typical but not promised on every CPU), and the candidate evaluation's share of a round.

    python benchmarks/fedrac_candidates.py [--config configs/fedrac/fashion-mnist-cla.toml] [--rounds 20]
        [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import emit

from fedhet.algorithms.allocation import candidate_sizes, masked_accuracies, masked_accuracies_loop
from fedhet.config import apply_override, load_config
from fedhet.experiment import make_simulation
from fedhet.models import masked_logits
from fedhet.models.masks import nested_prefix_masks

ROOT = Path(__file__).resolve().parents[1]


def best_time(fn, repeats: int) -> tuple[float, object]:
    """Minimum wall time over ``repeats`` calls (the least disturbed by other processes) and the result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def generic_accuracies(model, x, y, masks, batch_size: int = 2048) -> np.ndarray:
    correct = torch.zeros(masks.shape[0], dtype=torch.long)
    with torch.no_grad():
        model.eval()
        for start in range(0, len(x), batch_size):
            logits = masked_logits(model, x[start : start + batch_size], masks)
            correct += (logits.argmax(-1) == y[start : start + batch_size]).sum(1)
    return (correct.float() / len(y)).double().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "fedrac" / "fashion-mnist-cla.toml"))
    parser.add_argument("--rounds", type=int, default=20, help="FedRAC rounds before timing (and timed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="end with the JSON result line")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cfg = load_config(args.config)
    apply_override(cfg, "train.rounds", args.rounds)
    apply_override(cfg, "train.threads", args.threads)
    apply_override(cfg, "eval.every", args.rounds)
    apply_override(cfg, "method.name", "fedrac")
    with tempfile.TemporaryDirectory() as tmp:
        # Standalone accuracies come from the engine (a run with the same budget), as in every FedRAC run.
        sim = make_simulation(cfg, run_dir=Path(tmp) / "run")
        sim.run()
        timings = [json.loads(s) for s in (Path(tmp) / "run" / "timings.jsonl").read_text().splitlines()]
    strategy = sim.strategy
    round_s = statistics.mean(t["train_s"] for t in timings if t["round"] >= 2)
    candidate_s = statistics.mean(strategy.candidate_seconds)

    model = strategy.model
    vx, vy = strategy.val_x, strategy.val_y
    order = torch.argsort(strategy.frequency, stable=True)
    masks = nested_prefix_masks(
        order, candidate_sizes(strategy.units, strategy.candidate_step(args.rounds)), strategy.units
    )

    t_fast, fast = best_time(lambda: masked_accuracies(model, vx, vy, masks), args.repeats)
    t_generic, generic = best_time(lambda: generic_accuracies(model, vx, vy, masks), args.repeats)
    t_loop, loop = best_time(lambda: masked_accuracies_loop(model, vx, vy, masks), args.repeats)

    setting = f"{cfg.data.dataset} {cfg.data.split}, {cfg.model.name} (K = {strategy.units})"
    print(f"config {args.config}: {setting}, {cfg.data.clients} clients, {cfg.train.local_steps} local steps")
    print(f"torch threads {args.threads}; times are the minimum over {args.repeats} repeats")
    print(f"candidates: {masks.shape[0]} nested prefixes, validation set {len(vy)} images, ", end="")
    print(f"after {args.rounds} rounds")
    print(f"per-mask loop (reference code)             {1000 * t_loop:8.1f} ms")
    print(
        f"masked_logits per batch (generic batched)  {1000 * t_generic:8.1f} ms  {t_loop / t_generic:6.1f}x"
    )
    print(f"masked_accuracies (FedRAC, shared prefix)  {1000 * t_fast:8.1f} ms  {t_loop / t_fast:6.1f}x")
    # in validation samples: the paths use different kernels, so an argmax may flip on a near-tie
    flips_fast = int(np.rint(np.abs(fast - loop).max() * len(vy)))
    flips_generic = int(np.rint(np.abs(generic - loop).max() * len(vy)))
    print(f"largest accuracy difference to the loop: batched {flips_fast}, generic {flips_generic} ", end="")
    print("validation samples; ", end="")
    print(f"{len(np.unique(loop))} distinct values")
    share = candidate_s / round_s
    print(f"FedRAC round (server + {cfg.data.clients} clients, rounds 2..{args.rounds}): ", end="")
    print(f"{1000 * round_s:.1f} ms, ", end="")
    print(f"candidate evaluation {1000 * candidate_s:.1f} ms = {100 * share:.0f}% of it")
    with_loop = round_s - candidate_s + t_loop
    print(f"with the per-mask loop the round would take ~{1000 * with_loop:.1f} ms ", end="")
    print(f"({100 * t_loop / with_loop:.0f}% candidates)")
    if args.json:
        emit(
            "fedrac_candidates",
            {
                "loop_over_batched": t_loop / t_fast,
                "loop_over_generic": t_loop / t_generic,
                "candidate_share": share,
            },
            {"loop_over_batched": ">= 10"},
            settings=f"{setting}, {cfg.data.clients} clients, {masks.shape[0]} candidate submodels on "
            f"{len(vy)} validation images after {args.rounds} rounds, {args.threads} thread(s), minimum of "
            f"{args.repeats}",
            rows=[
                {"evaluation": "per-mask loop (reference code)", "ms": 1000 * t_loop},
                {"evaluation": "masked_logits per batch (generic batched)", "ms": 1000 * t_generic},
                {"evaluation": "masked_accuracies (FedRAC, shared prefix)", "ms": 1000 * t_fast},
            ],
            samples_differing=max(flips_fast, flips_generic),
        )


if __name__ == "__main__":
    main()
