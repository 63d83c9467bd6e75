"""The embedded engine against Flower's simulation engine on the same work, in one run.

Fashion-MNIST, the `mlp`, IID clients, 1 local epoch, FedAvg and CELM, 10 and 50 clients. Every cell runs in
its own process (so its peak memory is its own): the per-round time (median of the rounds' train + eval
time from the run's timings.jsonl, rounds 2 onwards), the start-up before round 1 (data, model, Ray and the
describe exchange for Flower), and the peak resident memory of the process and all its children (Ray's
workers included), sampled every 0.2 s from /proc.

    python benchmarks/engine_compare.py [--rounds 4] [--clients 10,50] [--methods fedavg,celm] [--one-step]

``--one-step`` adds FedAvg cells in which every client takes a single local step (one batch) instead of an
epoch: the same messages, almost no training, so each engine's round time is its own per-round cost. With
the one-epoch cells it splits Flower's round into its per-round cost and the training (the question of the
5x target: how much of a round an engine can save is bounded by what is not training).

Threads: the embedded engine uses one torch thread; Flower runs one client per CPU with one thread each (on
2 cores, two clients at a time), so Flower may use both cores where the embedded engine uses one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import emit


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and every descendant (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    family, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == pid and p not in family]
        family.update(kids)
        frontier += kids
    total = 0
    for pid in family:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def one_cell(engine: str, method: str, clients: int, rounds: int, steps: int | None = None) -> dict:
    """Run one (engine, method, clients) cell in this process; return its timings and peak memory.
    ``steps``: local steps per client instead of one epoch."""
    from fedhet.config import ExperimentConfig
    from fedhet.experiment import make_simulation

    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "iid", clients
    cfg.model.name = "mlp"
    cfg.train.rounds, cfg.train.local_epochs, cfg.train.batch_size, cfg.train.threads = rounds, 1, 64, 1
    cfg.eval.fairness, cfg.eval.every = False, 1
    cfg.method.name = method
    if steps is not None:
        cfg.train.local_steps = steps
    if method == "celm":
        cfg.method.params = {"warmup_fraction": 0.5}
    peak = {"rss": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak["rss"] = max(peak["rss"], tree_rss_bytes(os.getpid()))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    first_round: list[float] = []
    progress = lambda rnd, total, line: first_round.append(time.perf_counter()) if rnd == 1 else None  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        if engine == "flower":
            from fedhet.flower.server import run_flower_simulation

            run_flower_simulation(cfg, run_dir, progress=progress)
        else:
            make_simulation(cfg, run_dir=run_dir, progress=progress).run()
        wall = time.perf_counter() - started
        timings = [json.loads(s) for s in (run_dir / "timings.jsonl").read_text().splitlines()]
    stop.set()
    sampler.join()
    per_round = [t["train_s"] + t.get("eval_s", 0.0) for t in timings]
    parts = {  # Flower's round in parts (FlowerTransport.round_timing), medians over rounds 2 onwards
        key: statistics.median([t[key] for t in timings[1:] or timings])
        for key in timings[0]
        if key.startswith("flower_")
    }
    return {
        "engine": engine,
        "method": method,
        "clients": clients,
        "work": f"{steps} step(s)" if steps is not None else "1 epoch",
        "round_s": statistics.median(per_round[1:] or per_round),
        "startup_s": first_round[0] - started - per_round[0],
        "wall_s": wall,
        "peak_rss_gb": peak["rss"] / 1e9,
        "eval_s": statistics.median([t.get("eval_s", 0.0) for t in timings[1:] or timings]),
        **parts,
    }


def flower_split(row: dict) -> dict[str, float]:
    """Flower's median round in parts (seconds): the nodes' handlers as they overlap on the workers (their
    summed time over the workers that ran them: one per CPU), Flower carrying the messages and scheduling
    the nodes (the rest of the exchange: Ray, the SuperLink state, its 0.1 s polls), the server's encoding
    and decoding, and the round loop's own work (aggregation, evaluation)."""
    workers = min(os.cpu_count() or 1, row["clients"])
    nodes = row["flower_node_handler_sum_s"] / workers
    codec = row["flower_encode_s"] + row["flower_decode_s"]
    return {
        "nodes_s": nodes,
        "node_training_s": row["flower_node_work_sum_s"] / workers,
        "flower_transport_s": row["flower_exchange_s"] - nodes,
        "server_codec_s": codec,
        "round_loop_s": row["round_s"] - row["flower_exchange_s"] - codec,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", default="10,50")
    parser.add_argument("--methods", default="fedavg,celm")
    parser.add_argument("--one-step", action="store_true", help="add FedAvg cells of one local step")
    parser.add_argument("--json", action="store_true", help="end with the JSON result line")
    parser.add_argument("--one", nargs=3, metavar=("ENGINE", "METHOD", "CLIENTS"), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        engine, method, clients = args.one
        print(json.dumps(one_cell(engine, method, int(clients), args.rounds, args.steps)))
        return 0
    cells = [
        (engine, method, clients, None)
        for clients in (int(c) for c in args.clients.split(","))
        for method in args.methods.split(",")
        for engine in ("embedded", "flower")
    ]
    if args.one_step:
        cells += [
            (engine, "fedavg", clients, 1)
            for clients in (int(c) for c in args.clients.split(","))
            for engine in ("embedded", "flower")
        ]
    rows = []
    for engine, method, clients, steps in cells:
        cmd = [sys.executable, __file__, "--rounds", str(args.rounds), "--one", engine, method, str(clients)]
        done = subprocess.run(
            cmd + (["--steps", str(steps)] if steps else []), capture_output=True, text=True
        )
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"{engine:8s} {method:6s} N={clients:3d} {r['work']:9s} round {r['round_s']:6.2f} s  start-up "
            f"{r['startup_s']:6.2f} s  peak RSS {r['peak_rss_gb']:5.2f} GB",
            flush=True,
        )
    print()
    by = {(r["engine"], r["method"], r["clients"]): r for r in rows if r["work"] == "1 epoch"}
    light = {(r["engine"], r["clients"]): r for r in rows if r["work"] != "1 epoch"}
    ratios, targets = {}, {}
    for clients in (int(c) for c in args.clients.split(",")):
        for method in args.methods.split(","):
            e, f = by[("embedded", method, clients)], by[("flower", method, clients)]
            key = f"flower_over_embedded_round_{method}_{clients}"
            ratios[key] = f["round_s"] / e["round_s"]
            ratios[f"flower_over_embedded_memory_{method}_{clients}"] = f["peak_rss_gb"] / e["peak_rss_gb"]
            if clients == 10:
                targets[key] = ">= 5"
            print(
                f"RATIO flower/embedded {method} N={clients}: per round {f['round_s'] / e['round_s']:.2f}x, "
                f"peak memory {f['peak_rss_gb'] / e['peak_rss_gb']:.2f}x; Flower start-up "
                f"{f['startup_s']:.1f} s (embedded {e['startup_s']:.1f} s)"
            )
    for r in rows:
        if r["engine"] != "flower" or "flower_exchange_s" not in r:
            continue
        split = flower_split(r)
        tag = f"{r['method']}_{r['clients']}" + ("_one_step" if r["work"] != "1 epoch" else "")
        for key, value in split.items():
            ratios[f"flower_split_{key}_{tag}"] = value
        print(
            f"SPLIT Flower {r['method']} N={r['clients']} {r['work']}: round {r['round_s']:.2f} s = nodes' "
            f"handlers {split['nodes_s']:.2f} s (training {split['node_training_s']:.2f} s) + Flower's "
            f"transport and scheduling {split['flower_transport_s']:.2f} s + server encode/decode "
            f"{split['server_codec_s']:.3f} s + round loop (aggregation, evaluation) "
            f"{split['round_loop_s']:.2f} s"
        )
    for clients in sorted({c for _, c in light}):
        e, f = light[("embedded", clients)], light[("flower", clients)]
        ratios[f"flower_over_embedded_round_one_step_{clients}"] = f["round_s"] / e["round_s"]
        ratios[f"flower_round_cost_one_step_s_{clients}"] = f["round_s"]
        ratios[f"embedded_round_cost_one_step_s_{clients}"] = e["round_s"]
        epoch = by.get(("flower", "fedavg", clients))
        if epoch:  # what is left of Flower's one-epoch round once its per-round cost is taken out
            ratios[f"flower_training_share_{clients}"] = max(0.0, 1 - f["round_s"] / epoch["round_s"])
        print(
            f"RATIO flower/embedded one step N={clients}: per round {f['round_s'] / e['round_s']:.2f}x "
            f"(Flower {f['round_s']:.2f} s, embedded {e['round_s']:.2f} s)"
        )
    if args.json:
        emit(
            "engine_compare",
            ratios,
            targets,
            settings=f"Fashion-MNIST, mlp, IID, 1 local epoch, {args.rounds} rounds per cell, each cell in "
            "its own process; per-round time = median train + eval time of rounds 2 onwards; embedded: one "
            "torch thread, Flower: Ray simulation, one client per CPU"
            + ("; one-step cells: 1 local step (one batch of 64) per client" if args.one_step else ""),
            rows=rows,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
