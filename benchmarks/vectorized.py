"""Vectorized clients (engine.mode = "vectorized") against the sequential engine, one FedAvg round each.

N clients of 300 Fashion-MNIST samples each (IID), a small MLP (hidden 64), 1 local epoch, batch 32.
The sequential engine and the vectorized one by both its gradient paths (the closed form this ReLU-stack
MLP takes, and the general ``vmap`` over ``grad`` any model takes) run the same round from the same global
weights, alternately in one process (``--repeats`` rounds each, median); their global models are compared.

    python benchmarks/vectorized.py [--clients 50 200] [--repeats 3] [--threads 1] [--json]

Target: vectorized ≥ 3× faster than sequential at 50 clients.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import emit

from fedhet.config import ExperimentConfig
from fedhet.engine import vectorized
from fedhet.experiment import make_simulation

SAMPLES = 300


def make_sim(clients: int, mode: str, samples: int = SAMPLES):
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "iid", clients
    cfg.data.max_train_samples = clients * samples
    cfg.model.name, cfg.model.params = "mlp", {"hidden_sizes": [64]}
    cfg.train.rounds, cfg.train.local_epochs, cfg.train.batch_size, cfg.train.lr = 1, 1, 32, 0.05
    cfg.eval.fairness = False
    cfg.engine.mode = mode
    sim = make_simulation(cfg)
    sim.setup()
    return sim


#: the vectorized engine's two ways to a group's gradients (engine/vectorized.py GRADIENTS): "auto" takes the
#: closed form for this ReLU-stack MLP, "vmap" the general vmap over grad
VECTOR_PATHS = {"vectorized": "auto", "vectorized_vmap": "vmap"}


def measure(clients: int, repeats: int, samples: int = SAMPLES) -> dict:
    sims = {"sequential": make_sim(clients, "sequential", samples)}
    sims.update({name: make_sim(clients, "vectorized", samples) for name in VECTOR_PATHS})
    start = {k: v.clone() for k, v in sims["sequential"].strategy.model.state_dict().items()}
    times: dict[str, list[float]] = {mode: [] for mode in sims}
    for rep in range(repeats + 1):  # the first round of each warms its path up and is not counted
        for mode, sim in sims.items():
            vectorized.GRADIENTS = VECTOR_PATHS.get(mode, "auto")
            sim.strategy.model.load_state_dict(start)
            t0 = time.perf_counter()
            sim.train_round(1)
            if rep:
                times[mode].append(time.perf_counter() - t0)
    vectorized.GRADIENTS = "auto"
    seq = sims["sequential"].strategy.model.state_dict()
    gap = {
        name: max(float((seq[k] - sims[name].strategy.model.state_dict()[k]).abs().max()) for k in seq)
        for name in VECTOR_PATHS
    }
    med = {mode: statistics.median(ts) for mode, ts in times.items()}
    return {
        "clients": clients,
        "sequential_s": med["sequential"],
        "vectorized_s": med["vectorized"],
        "vectorized_vmap_s": med["vectorized_vmap"],
        "speedup": med["sequential"] / med["vectorized"],
        "speedup_vmap": med["sequential"] / med["vectorized_vmap"],
        "max_weight_gap": max(gap.values()),
        "per_client_ms": {m: 1000 * med[m] / clients for m in med},
    }


def scaling(counts: list[int], repeats: int, plot: str | None) -> tuple[list[dict], dict[str, float]]:
    """Round time against the client count, 60 samples per client (2 local steps), both modes; the
    per-client constant is the slope of a least-squares line through (clients, seconds)."""
    import numpy as np

    rows = [measure(n, repeats, samples=60) for n in counts]
    slopes = {}
    modes = ("sequential", *VECTOR_PATHS)
    for mode in modes:
        seconds = [r[f"{mode}_s"] for r in rows]
        slopes[mode] = 1000 * float(np.polyfit(counts, seconds, 1)[0])
    print("round time vs clients (60 samples each): per-client constant (slope) "
          + ", ".join(f"{mode} {slopes[mode]:.2f} ms" for mode in modes))  # fmt: skip
    for r in rows:
        print(f"  {r['clients']:>5} clients: sequential {r['sequential_s']:.3f} s, vectorized "
              f"{r['vectorized_s']:.3f} s ({r['speedup']:.2f}×), vectorized by vmap "
              f"{r['vectorized_vmap_s']:.3f} s ({r['speedup_vmap']:.2f}×)")  # fmt: skip
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
        for mode in modes:
            ax.plot(
                counts, [r[f"{mode}_s"] for r in rows], "o-", label=f"{mode} ({slopes[mode]:.2f} ms/client)"
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("clients in the round (60 samples each)")
        ax.set_ylabel("round time (s)")
        ax.set_title("FedAvg round, mlp [64], 1 thread")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.savefig(plot, dpi=110)
        print(f"plot: {plot}")
    return rows, slopes


def flat(row: dict) -> dict:
    """A measured row with the per-client times as columns of their own (for a Markdown table)."""
    out = {k: v for k, v in row.items() if k != "per_client_ms"}
    out.update({f"{m}_ms_per_client": v for m, v in row["per_client_ms"].items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[50, 200])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--scaling", type=int, nargs="*", help="round time at these client counts (60 samples each)"
    )
    ap.add_argument("--plot", help="PNG of the --scaling curve")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.scaling:
        rows, slopes = scaling(args.scaling, args.repeats, args.plot)
        if args.json:
            emit(
                "vectorized_scaling",
                {f"{key}_{r['clients']}": r[key] for r in rows for key in ("speedup", "speedup_vmap")},
                {},
                settings=f"one FedAvg round, 60 Fashion-MNIST samples per client (2 local steps of 32), mlp "
                f"[64], {args.threads} thread(s), median of {args.repeats}; per-client constant = slope of a "
                "least-squares line through (clients, round seconds)",
                rows=[flat(r) for r in rows],
                per_client_ms=slopes,
                plot=args.plot,
            )
        return
    rows = [measure(n, args.repeats) for n in args.clients]
    if args.json:
        emit(
            "vectorized",
            {f"{key}_{r['clients']}": r[key] for r in rows for key in ("speedup", "speedup_vmap")},
            {"speedup_50": ">= 3"} if 50 in args.clients else {},
            settings=f"one FedAvg round, {SAMPLES} Fashion-MNIST samples per client (IID), mlp [64], "
            f"batch 32, 1 local epoch, {args.threads} thread(s), median of {args.repeats} alternating "
            "rounds; speedup: the vectorized engine as it runs this MLP (closed-form gradients), "
            "speedup_vmap: its general vmap-over-grad path (any model)",
            rows=[flat(r) for r in rows],
        )
        return
    print(f"FedAvg round, {SAMPLES} samples per client, mlp [64], batch 32, threads={args.threads}, "
          f"median of {args.repeats}")  # fmt: skip
    print(f"{'clients':>8} {'sequential':>11} {'vectorized':>11} {'speed-up':>9} {'by vmap':>9} "
          f"{'speed-up':>9} {'ms/client seq':>14} {'ms/client vec':>14} {'max |Δw|':>10}")  # fmt: skip
    for r in rows:
        print(
            f"{r['clients']:>8} {r['sequential_s']:>10.3f}s {r['vectorized_s']:>10.3f}s "
            f"{r['speedup']:>8.2f}× {r['vectorized_vmap_s']:>8.3f}s {r['speedup_vmap']:>8.2f}× "
            f"{r['per_client_ms']['sequential']:>14.2f} {r['per_client_ms']['vectorized']:>14.2f} "
            f"{r['max_weight_gap']:>10.1e}"
        )
    print("vectorized: closed-form gradients (this MLP is a plain ReLU stack); by vmap: the general path")
    print("target: speed-up >= 3 at 50 clients")


if __name__ == "__main__":
    main()
