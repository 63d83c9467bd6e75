"""Engine overhead: a FedAvg round in fedhet vs a bare PyTorch loop doing exactly the same training.

Both train the same model from the same weights on the same batches (the same per-client generators)
with the same optimizer, then average by sample count. They are timed alternately in one process
(``--repeats`` pairs, median of each) on Fashion-MNIST, 10 IID clients, the `mlp`, 1 local epoch.
Then a separate process runs a 10-client Fashion-MNIST experiment and reports its peak RSS.

    python benchmarks/engine_overhead.py [--repeats 5] [--threads 1]

Targets: time ratio engine/bare <= 1.05; peak RSS of the 10-client run <= 1.5 GB.
With ``--json`` the last line is the result object ``make bench`` gathers (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

import torch
from common import emit
from torch import nn

from fedhet.config import ExperimentConfig
from fedhet.engine.schedule import learning_rate
from fedhet.engine.seeds import derived_torch_generator
from fedhet.experiment import make_simulation


def make_config(rounds: int = 1) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "iid", 10
    cfg.model.name = "mlp"
    cfg.train.rounds, cfg.train.local_epochs, cfg.train.batch_size, cfg.train.lr = rounds, 1, 64, 0.1
    cfg.eval.fairness = False
    return cfg


def bare_round(sim, global_weights: dict, rnd: int) -> dict:
    """The same round written as a plain loop over clients, no fedhet objects on the hot path."""
    cfg = sim.cfg
    model = sim.work_model
    lr = learning_rate(cfg, rnd)
    states, sizes = [], []
    for data in sim.fed.clients:
        model.load_state_dict(global_weights)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        g = derived_torch_generator(cfg.seed, "client", rnd, data.cid)
        n = data.indices.numel()
        perm = data.indices[torch.randperm(n, generator=g)]
        for start in range(0, n, cfg.train.batch_size):
            idx = perm[start : start + cfg.train.batch_size]
            opt.zero_grad(set_to_none=True)
            # index_select, as the engine gathers (2-3x faster than inputs[idx] on the CPU)
            x, y = data.inputs.index_select(0, idx), data.labels.index_select(0, idx)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        sizes.append(n)
    total = sum(sizes)
    return {k: sum(s[k] * (n / total) for s, n in zip(states, sizes, strict=True)) for k in states[0]}


def measure_rss() -> None:
    cfg = make_config(rounds=3)
    make_simulation(cfg).run()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="end with the JSON result line")
    ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.rss_child:
        measure_rss()
        return
    sim = make_simulation(make_config())
    sim.setup()
    start = {k: v.clone() for k, v in sim.strategy.model.state_dict().items()}
    # warm-up both paths once
    sim.train_round(1)
    sim.strategy.model.load_state_dict(start)
    bare = bare_round(sim, start, 1)
    engine_t, bare_t = [], []
    for _ in range(args.repeats):
        sim.strategy.model.load_state_dict(start)
        t0 = time.perf_counter()
        sim.train_round(1)
        engine_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bare = bare_round(sim, start, 1)
        bare_t.append(time.perf_counter() - t0)
    same = all(torch.allclose(bare[k], v, atol=1e-6) for k, v in sim.strategy.model.state_dict().items())
    e, b = statistics.median(engine_t), statistics.median(bare_t)
    print(
        f"threads={args.threads} repeats={args.repeats} (Fashion-MNIST, 10 IID clients, mlp, 1 local epoch)"
    )
    print(f"engine round  median {e * 1000:.1f} ms   (all: {', '.join(f'{t * 1000:.0f}' for t in engine_t)})")
    print(f"bare loop     median {b * 1000:.1f} ms   (all: {', '.join(f'{t * 1000:.0f}' for t in bare_t)})")
    print(f"same resulting weights: {same}")
    print(f"RATIO engine/bare = {e / b:.3f}   (target <= 1.05)")
    out = subprocess.run(
        [sys.executable, __file__, "--rss-child", "--threads", str(args.threads)],
        capture_output=True,
        text=True,
        check=True,
    )
    rss_gb = int(out.stdout.strip().splitlines()[-1]) / 1024**2
    print(f"PEAK RSS of a 3-round 10-client Fashion-MNIST run = {rss_gb:.2f} GB   (target <= 1.5 GB)")
    if args.json:
        emit(
            "engine_overhead",
            {"engine_over_bare": e / b, "run_peak_rss_gb": rss_gb},
            {"engine_over_bare": "<= 1.05", "run_peak_rss_gb": "<= 1.5"},
            settings=f"one FedAvg round, Fashion-MNIST, 10 IID clients, mlp, 1 local epoch, batch 64, "
            f"{args.threads} thread(s), median of {args.repeats} alternating pairs; peak RSS of a separate "
            "3-round run",
            rows=[
                {"path": "fedhet engine", "round_ms": 1000 * e},
                {"path": "bare PyTorch loop", "round_ms": 1000 * b},
            ],
            same_weights=bool(same),
        )


if __name__ == "__main__":
    main()
