"""Exact Shapley's cost: every coalition trained together (``fedhet shapley``) against one run per coalition.

FedAvg on digits, Dirichlet(0.5)-per-class split, the default MLP, 30 rounds, 1 local epoch, batch 64: the
2^N − 1 coalitions of N = 8 clients trained together (fedhet.ground_truth.coalitions.train_together) and one
embedded run at a time (``train_one_at_a_time``, the engine's own path for each coalition); then N = 10
together. With ``--fashion-mnist`` also N = 8 on 12,000 Fashion-MNIST images with ``mlp200`` (about ten
minutes on 2 cores). The utilities of the two paths are compared (largest accuracy difference).

    python benchmarks/coalitions.py [--rounds 30] [--fashion-mnist] [--json]

Targets (2 cores): N = 8 on digits ≤ 30 s and ≥ 2× faster than one at a time; N = 10 ≤ 180 s; N = 8 on
Fashion-MNIST ≤ 900 s.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from common import emit

from fedhet.config import ExperimentConfig, apply_overrides
from fedhet.ground_truth.coalitions import train_one_at_a_time, train_together


def config(dataset: str, clients: int, rounds: int, **more) -> ExperimentConfig:
    cfg = ExperimentConfig()
    overrides = {
        "data.dataset": dataset,
        "data.clients": clients,
        "data.split": "dirichlet-per-class",
        "data.split_params.alpha": 0.5,
        "train.rounds": rounds,
        **more,
    }
    apply_overrides(cfg, [(k, json.dumps(v)) for k, v in overrides.items()])
    return cfg


def timed(train, cfg: ExperimentConfig):
    t0 = time.perf_counter()
    result = train(cfg)
    return result, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--fashion-mnist", action="store_true", help="also N = 8 on Fashion-MNIST (≈10 min)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    digits8 = config("digits", 8, args.rounds)
    together, t_together = timed(train_together, digits8)
    alone, t_alone = timed(train_one_at_a_time, digits8)
    gap = float(np.max(np.abs(together.utilities["accuracy"] - alone.utilities["accuracy"])))
    rows.append(
        {
            "federation": "digits, N = 8",
            "coalitions": 255,
            "together_s": t_together,
            "one_at_a_time_s": t_alone,
            "max_accuracy_difference": gap,
        }
    )
    _, t10 = timed(train_together, config("digits", 10, args.rounds))
    rows.append({"federation": "digits, N = 10", "coalitions": 1023, "together_s": t10})
    ratios = {
        "digits8_together_s": t_together,
        "digits8_speedup": t_alone / t_together,
        "digits10_together_s": t10,
    }
    targets = {"digits8_together_s": "<= 30", "digits8_speedup": ">= 2", "digits10_together_s": "<= 180"}
    if args.fashion_mnist:
        fmnist = config(
            "fashion-mnist", 8, args.rounds, **{"model.name": "mlp200", "data.max_train_samples": 12000}
        )
        _, t_fm = timed(train_together, fmnist)
        rows.append(
            {"federation": "Fashion-MNIST 12,000, mlp200, N = 8", "coalitions": 255, "together_s": t_fm}
        )
        ratios["fmnist8_together_s"] = t_fm
        targets["fmnist8_together_s"] = "<= 900"
    print(f"{'federation':<38} {'together s':>10} {'one at a time s':>16} {'speed-up':>9}")
    for row in rows:
        alone_s = row.get("one_at_a_time_s")
        speed = f"{alone_s / row['together_s']:.2f}x" if alone_s else ""
        print(
            f"{row['federation']:<38} {row['together_s']:>10.1f} {alone_s or float('nan'):>16.1f} {speed:>9}"
        )
    print(f"largest accuracy difference between the two paths (N = 8): {gap:.4f}")
    if args.json:
        emit(
            "coalitions",
            ratios,
            targets,
            settings=f"FedAvg, Dirichlet(0.5) per class, default MLP, {args.rounds} rounds, batch 64, "
            "1 epoch; every coalition trained together against one embedded run per coalition",
            rows=rows,
        )


if __name__ == "__main__":
    main()
