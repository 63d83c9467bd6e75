"""CELM probe cost: the batched probe (all models and classes in one batch: closed-form input gradients
for the MLP, and the generic vmap over stacked models) against the per-(client, class) loop, and against
one FedAvg round of local training (targets: batched ≥ 15× faster than the loop; probing ≤ 0.5 ×
one round, Fashion-MNIST MLP, N = 10).

Usage: python benchmarks/celm_probe.py [--clients 10] [--threads 1] [--repeats 3] [--steps 200]

The round and the probes run in this one process with the same thread count (default 1 thread, as in the
experiments). Times are the median over ``--repeats`` (the loop runs once: it is the slow reference).
The vmap set-up cost of the first batched call in a process is timed and reported apart. Both wall time
and this process's CPU time are printed; on a shared machine the CPU-time ratios are the stable ones
(with one thread, CPU time is the compute the process did, whatever else runs beside it).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import emit

from fedhet.algorithms.celm import probe_generator
from fedhet.algorithms.logit_probes import maximize_class_logits
from fedhet.config import ExperimentConfig
from fedhet.engine.weights import clone_weights
from fedhet.experiment import make_simulation


def timed(fn) -> tuple[tuple[float, float], object]:
    """(wall seconds, CPU seconds of this process) and the result of ``fn()``."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - w0, time.process_time() - c0), out


def median(times: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200, help="probe Adam steps (CELM default 200)")
    ap.add_argument("--split", default="maverick", help="data split of the federation (default maverick)")
    ap.add_argument("--json", action="store_true", help="end with the JSON result line")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", args.split, args.clients
    cfg.model.name = "mlp"
    cfg.train.rounds, cfg.train.threads, cfg.train.device = 100, args.threads, "cpu"
    cfg.method.name = "fedavg"
    cfg.eval.fairness = False
    sim = make_simulation(cfg, run_dir=None)
    sim.setup()

    # One FedAvg round of local training (1 epoch per client over all of Fashion-MNIST), repeated from the
    # same start; the client models of the first repeat are what gets probed.
    start = clone_weights(sim.strategy.model.state_dict())
    round_times, states = [], None
    for _ in range(args.repeats):
        sim.strategy.model.load_state_dict(start)
        captured: dict[int, dict] = {}
        aggregate = sim.strategy.aggregate

        def capture(rnd, replies, _agg=aggregate, _out=captured):
            _out.update({c: r.weights for c, r in replies.items()})
            return _agg(rnd, replies)

        sim.strategy.aggregate = capture
        seconds, _ = timed(lambda: sim.train_round(1))
        sim.strategy.aggregate = aggregate
        round_times.append(seconds)
        if states is None:
            states = [start] + [captured[c] for c in sorted(captured)]
    model = sim.strategy.model
    shape, k = tuple(sim.fed.dataset.input_shape), sim.fed.num_classes

    def probe(impl: str):
        return maximize_class_logits(
            model, states, shape, k, steps=args.steps, generator=probe_generator(0, 1), impl=impl
        )

    first_call, _ = timed(lambda: probe("vmap"))
    batched_times, vmap_times = [], []
    for _ in range(args.repeats):
        seconds, batched = timed(lambda: probe("batched"))
        batched_times.append(seconds)
        seconds, via_vmap = timed(lambda: probe("vmap"))
        vmap_times.append(seconds)
    loop_time, loop = timed(lambda: probe("loop"))

    t_round, t_batched, t_vmap = median(round_times), median(batched_times), median(vmap_times)
    diff = (batched - loop).abs()
    diff_vmap = (via_vmap - loop).abs()
    probes = len(states) * k
    print(
        f"CELM probe benchmark · Fashion-MNIST MLP · {args.clients} clients + global = {len(states)} models"
    )
    print(
        f"  {probes} probes × {args.steps} Adam steps · {args.threads} thread(s) · median of {args.repeats}"
    )
    print(f"  {'':46s} {'wall s':>8s} {'CPU s':>8s}")
    rows = (
        (f"FedAvg round (local training, {sum(sim.fed.sizes)} samples)", t_round),
        ("probe, batched (MLP closed-form gradients)", t_batched),
        ("probe, batched via vmap (any model)", t_vmap),
        ("probe, vmap, first call (vmap set-up)", first_call),
        ("probe, per-(client, class) loop", loop_time),
    )
    for label, (wall, cpu) in rows:
        print(f"  {label:46s} {wall:8.3f} {cpu:8.3f}")
    print(
        f"  vs loop: max |Δ logit| batched {diff.max():.2e}, vmap {diff_vmap.max():.2e}"
        f" (max logit {loop.abs().max():.1f})"
    )
    for view, i in (("CPU time", 1), ("wall time", 0)):
        print(f"ratio loop / batched       = {loop_time[i] / t_batched[i]:6.2f}x   (target >= 15x; {view})")
        print(f"ratio probe / FedAvg round = {t_batched[i] / t_round[i]:6.2f}x   (target <= 0.5x; {view})")
        print(f"ratio loop / vmap          = {loop_time[i] / t_vmap[i]:6.2f}x   ({view}; the generic path)")
    if args.json:
        emit(
            "celm_probe",
            {
                "loop_over_batched_cpu": loop_time[1] / t_batched[1],
                "probe_over_round_cpu": t_batched[1] / t_round[1],
                "loop_over_vmap_cpu": loop_time[1] / t_vmap[1],
            },
            {"loop_over_batched_cpu": ">= 15", "probe_over_round_cpu": "<= 0.5"},
            settings=f"Fashion-MNIST mlp, {args.split} split, {args.clients} clients + the global model, "
            f"{probes} probes x {args.steps} Adam steps, {args.threads} thread(s), median of {args.repeats}; "
            "ratios of this process's CPU time",
            rows=[{"what": label, "wall_s": wall, "cpu_s": cpu} for label, (wall, cpu) in rows],
        )


if __name__ == "__main__":
    main()
