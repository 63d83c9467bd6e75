"""Flower's simulation engine against the embedded engine on a small table: wine over three sites.

The run of examples/flower-app/wine.toml (FedAvg, tabular-mlp, three Dirichlet sites) with ``--rounds``
rounds, on each engine in this process, one torch thread (the nodes use one each): the wall time of each
run and its median round (``timings.jsonl``: train + eval), their ratios, and a minimal Flower app's run on
the same simulation engine, nodes and rounds, first and in a process of its own (a ServerApp that waits for
the nodes, sends each the model's weights, and a ClientApp that sends them straight back: Flower's own
floor per round, which no app on it can go below); then where the Flower run's time goes in this process
(cProfile of the server side: Ray's start-up, the exchange, the round loop; the nodes' own work runs in
Ray's workers, reported by the run's timings.jsonl). Both fedhet runs give the same metrics.jsonl
(tests/test_flower.py): fedhet on Flower / the minimal app is what fedhet adds to Flower's own cost.

The minimal app once ran after fedhet's Flower run in this process and reported rounds of 0.000 s: its
ServerApp asked for the node ids before the simulation had registered its SuperNodes and exchanged nothing
with zero nodes. It now waits for every node, refuses a round without all replies or with an error reply,
and runs in a child process (``--minimal-only``).

    python benchmarks/flower_table.py [--rounds 20] [--top 12] [--json]
    python benchmarks/flower_table.py --minimal-only [--rounds 20]   # the minimal app alone: one JSON line
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import emit

ROOT = Path(__file__).resolve().parents[1]


def minimal_flower_run(weights: dict, nodes: int, rounds: int) -> tuple[float, list[float]]:
    """Wall time of a run of ``rounds`` rounds of a ServerApp that sends ``weights`` to every one of ``nodes``
    nodes and waits for their replies, the ClientApp returning what it got (same Ray backend as fedhet's
    run), and each round's time (after the first exchange, which starts the nodes)."""
    from flwr.app import ArrayRecord, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    server, client = ServerApp(), ClientApp()
    round_times: list[float] = []

    @client.train()
    def echo(msg, context):  # noqa: ARG001 - Flower's signature
        return Message(content=msg.content, reply_to=msg)

    @server.main()
    def loop(grid, context):  # noqa: ARG001 - Flower's signature
        content = RecordDict({"weights": ArrayRecord(weights)})  # a torch state_dict
        deadline = time.monotonic() + 120  # as fedhet's ServerApp does: the nodes register after it starts
        while len(ids := list(grid.get_node_ids())) < nodes and time.monotonic() < deadline:
            time.sleep(0.1)
        if len(ids) != nodes:
            raise RuntimeError(f"{len(ids)} of {nodes} simulated nodes registered within 120 s")
        for r in range(rounds + 1):  # an exchange to start the nodes (fedhet's describe), then the rounds
            begun = time.perf_counter()
            sent = [Message(content=content, dst_node_id=i, message_type="train") for i in ids]
            replies = list(grid.send_and_receive(sent))
            errors = [m.error.reason for m in replies if m.has_error()]
            if len(replies) != len(ids) or errors:
                raise RuntimeError(f"round {r}: {len(replies)} of {len(ids)} replies; errors: {errors}")
            if r:
                round_times.append(time.perf_counter() - begun)

    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"include_dashboard": False, "num_cpus": os.cpu_count() or 1},
    }
    started = time.perf_counter()
    run_simulation(server, client, num_supernodes=nodes, backend_config=backend)
    if len(round_times) != rounds:
        raise RuntimeError(f"the minimal app ran {len(round_times)} of {rounds} rounds (its log says why)")
    return time.perf_counter() - started, round_times


def wine_config(rounds: int):
    from fedhet.config import load_config

    cfg = load_config(ROOT / "examples" / "flower-app" / "wine.toml")
    cfg.train.rounds = rounds
    return cfg


def minimal_only(rounds: int) -> int:
    """The minimal app on the wine model's weights, alone in this process: one JSON line (wall, rounds)."""
    from fedhet.data.datasets import load_dataset
    from fedhet.models import build_model

    cfg = wine_config(rounds)
    data = load_dataset("wine")
    model = build_model(cfg.model.name, data.input_shape, data.num_classes, **cfg.model.params)
    wall, round_times = minimal_flower_run(model.state_dict(), cfg.data.clients, rounds)
    print(json.dumps({"minimal_s": wall, "round_s": round_times}), flush=True)
    return 0


def minimal_in_child(rounds: int) -> tuple[float, list[float]]:
    """:func:`minimal_only` in a child process (no Ray or Flower state shared with fedhet's run)."""
    done = subprocess.run(
        [sys.executable, __file__, "--minimal-only", "--rounds", str(rounds)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the minimal app's process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["minimal_s"], result["round_s"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--top", type=int, default=12, help="profile lines to print")
    parser.add_argument("--json", action="store_true", help="end with the JSON result line")
    parser.add_argument("--minimal-only", action="store_true", help="run only the minimal app (JSON line)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    if args.minimal_only:
        return minimal_only(args.rounds)

    from fedhet.experiment import make_simulation
    from fedhet.flower.server import run_flower_simulation

    load_before = os.getloadavg()[0]  # a shared machine's load stretches Flower's polling rounds
    cfg = wine_config(args.rounds)
    # first, so that no process of fedhet's Flower run (Ray's) is still going while it runs
    minimal_s, minimal_rounds = minimal_in_child(args.rounds)
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
        embedded_timings = [
            json.loads(s) for s in (Path(tmp) / "embedded" / "timings.jsonl").read_text().splitlines()
        ]
    rounds_s = sum(t["train_s"] + t.get("eval_s", 0.0) for t in timings)
    load_after = os.getloadavg()[0]
    load = f"load average {load_before:.1f} at the start, {load_after:.1f} at the end, {os.cpu_count()} CPUs"
    work_s = sum(t["flower_node_work_sum_s"] for t in timings)
    print(f"wine, 3 sites, {args.rounds} rounds, FedAvg, tabular-mlp, one torch thread per process; {load}")
    print(f"embedded engine: {embedded_s:.2f} s")
    print(
        f"Flower simulation: {flower_s:.2f} s  (rounds {rounds_s:.2f} s, of which the nodes' training "
        f"{work_s:.2f} s)"
    )
    print(f"ratio Flower / embedded: {flower_s / embedded_s:.1f}x; metrics.jsonl identical: {same}")
    print(
        f"minimal Flower app (echo ClientApp, same nodes, rounds and weights): {minimal_s:.2f} s; "
        f"fedhet on Flower / minimal Flower app: {flower_s / minimal_s:.2f}x"
    )
    # the median round: a one-time cost inside a round (a node's first optimizer step imports part of torch)
    # is start-up, not a round's price
    per_round = statistics.median(t["train_s"] + t.get("eval_s", 0.0) for t in timings)
    node_work = statistics.median(t["flower_node_work_sum_s"] for t in timings)
    minimal_per_round = statistics.median(minimal_rounds)
    embedded_round = statistics.median(t["train_s"] + t.get("eval_s", 0.0) for t in embedded_timings)
    print(
        f"median round: fedhet on Flower {per_round:.3f} s (its nodes' training, summed: {node_work:.3f} s), "
        f"minimal Flower app {minimal_per_round:.3f} s: {per_round / minimal_per_round:.2f}x; embedded "
        f"{embedded_round:.4f} s: Flower / embedded per round {per_round / embedded_round:.1f}x"
    )
    print("rounds, s: fedhet on Flower", [round(t["train_s"] + t.get("eval_s", 0.0), 3) for t in timings])
    print("rounds, s: minimal Flower app", [round(t, 3) for t in minimal_rounds])
    print(
        f"Flower run outside its rounds (Ray's and the nodes' start-up, the end): {flower_s - rounds_s:.2f} s"
    )
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
    print(text.getvalue())
    if args.json:
        emit(
            "flower_table",
            {
                "simulation_over_embedded_round": per_round / embedded_round,
                "fedhet_over_minimal_flower_simulation_round": per_round / minimal_per_round,
                "simulation_over_embedded_run": flower_s / embedded_s,
                "fedhet_over_minimal_flower_simulation_run": flower_s / minimal_s,
            },
            {},
            settings=(
                f"wine, 3 sites, {args.rounds} rounds, FedAvg, tabular-mlp, one torch thread per process; "
                "Flower: its simulation engine (Ray), one virtual SuperNode per site; per-round medians; "
                f"the minimal app in a process of its own, run first; {load}"
            ),
            rows=[
                {
                    "embedded_s": embedded_s,
                    "flower_s": flower_s,
                    "flower_startup_s": flower_s - rounds_s,
                    "minimal_flower_s": minimal_s,
                    "embedded_round_s": embedded_round,
                    "flower_round_s": per_round,
                    "minimal_flower_round_s": minimal_per_round,
                    "identical": same,
                }
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
