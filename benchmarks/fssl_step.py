"""Time one local step of every FSSL method (and the supervised baselines) on CIFAR-10 / Fashion-MNIST.

Sizes the CPU-scale configurations of configs/proxyfl/: it runs ``--steps`` local steps of one client through
the engine's trainer (augmentation, frozen global model, ICPL, ...) and prints milliseconds per step and the
ratio to the labeled-only FedAvg step, plus the server's GPT time per round for 8 clients.

    .venv/bin/python benchmarks/fssl_step.py --dataset cifar10 --width 8 --batch-size 32 --threads 1
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from common import emit

from fedhet.config import ExperimentConfig
from fedhet.engine.client import run_client
from fedhet.engine.protocol import LR_KEY, ClientState, TrainContext
from fedhet.engine.seeds import derived_torch_generator
from fedhet.experiment import make_simulation

METHODS = (
    "fedavg-labeled",
    "fedavg-full",
    "fixmatch-lpl",
    "fixmatch-gpl",
    "sage",
    "proxyfl",
    "fedproto-fssl",
)


def time_method(method: str, args: argparse.Namespace) -> float:
    """Milliseconds per local step of ``method`` (median of 3 repeats of ``args.steps`` steps)."""
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = args.dataset, "labeled-unlabeled", 10
    cfg.data.split_params = {"labeled_per_class": 500, "alpha": 0.5}
    cfg.model.name, cfg.model.params = "resnet8", {"width": args.width}
    cfg.train.batch_size, cfg.train.local_steps = args.batch_size, args.steps
    cfg.train.momentum, cfg.train.weight_decay, cfg.train.threads = 0.9, 1e-4, args.threads
    cfg.eval.fairness, cfg.eval.rewards = False, False
    cfg.method.name = method
    sim = make_simulation(cfg)
    sim.setup()
    times = []
    for repeat in range(3):
        ins = sim.strategy.configure(1, [0])[0]
        ins.config[LR_KEY] = cfg.train.lr
        ctx = TrainContext(
            1, derived_torch_generator(0, "client", repeat, 0), sim.device, cfg.train, sim.work_model, {}
        )
        start = time.perf_counter()
        run_client(sim.trainer, ins, ClientState(), sim.fed.clients[0], ctx)
        times.append((time.perf_counter() - start) / args.steps)
    return 1000 * float(np.median(times))


def time_gpt(args: argparse.Namespace) -> float:
    """Seconds of one round of GPT (Q = 100 epochs, batch 4) for 8 clients' proxies."""
    from fedhet.algorithms.proxyfl import global_proxy_tuning

    dim = 4 * args.width
    local = torch.randn(8, 10, dim)
    start = time.perf_counter()
    global_proxy_tuning(local.mean(0), local, epochs=100, rng=np.random.default_rng(0))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cifar10")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", action="store_true", help="end with the JSON result line")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{args.dataset}, resnet8 width {args.width}, B = {args.batch_size} (+2B unlabeled), "
        f"{args.threads} thread(s)"
    )
    base, rows = None, []
    for method in args.methods.split(","):
        ms = time_method(method, args)
        base = base or ms
        rows.append({"method": method, "ms_per_step": ms, "vs_first": ms / base})
        print(
            f"  {method:16s} {ms:8.1f} ms/step   x{ms / base:5.2f} vs {args.methods.split(',')[0]}",
            flush=True,
        )
    gpt_s = time_gpt(args)
    print(f"  GPT (8 clients, Q=100, batch 4): {gpt_s:.2f} s/round")
    if args.json:
        emit(
            "fssl_step",
            {f"{r['method']}_over_{rows[0]['method']}": r["vs_first"] for r in rows[1:]},
            {},
            settings=f"{args.dataset}, resnet8 width {args.width}, B = {args.batch_size} labeled + "
            f"{2 * args.batch_size} unlabeled, {args.threads} thread(s), median of 3 x {args.steps} steps; "
            "GPT: 8 clients' proxies, Q = 100 epochs, batch 4",
            rows=rows,
            gpt_seconds_per_round=gpt_s,
        )


if __name__ == "__main__":
    main()
