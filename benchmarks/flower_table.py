"""Flower's simulation engine against the embedded engine on a small table: wine over three sites.

The run of examples/flower-app/wine.toml (FedAvg, tabular-mlp, three Dirichlet sites) with ``--rounds``
rounds, on each engine in this process, one torch thread (the nodes use one each): the wall time of each
run, their ratio, and a minimal Flower app's run on the same simulation engine, nodes and rounds (a
ServerApp that sends each node the model's weights and a ClientApp that sends them straight back: Flower's
own floor per round, which no app on it can go below); then where the Flower run's time goes in this
process (cProfile of the server side: Ray's start-up, the exchange, the round loop; the nodes' own work runs
in Ray's workers, reported by the run's timings.jsonl). Both fedhet runs give the same metrics.jsonl
(tests/test_flower.py): fedhet on Flower / the minimal app is what fedhet adds to Flower's own cost.

    python benchmarks/flower_table.py [--rounds 20] [--top 12] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
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
    import os

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
        ids = list(grid.get_node_ids())
        for r in range(rounds + 1):  # an exchange to start the nodes (fedhet's describe), then the rounds
            begun = time.perf_counter()
            sent = [Message(content=content, dst_node_id=i, message_type="train") for i in ids]
            replies = list(grid.send_and_receive(sent))
            assert len(replies) == len(ids)
            if r:
                round_times.append(time.perf_counter() - begun)

    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"include_dashboard": False, "num_cpus": os.cpu_count() or 1},
    }
    started = time.perf_counter()
    run_simulation(server, client, num_supernodes=nodes, backend_config=backend)
    return time.perf_counter() - started, round_times


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
        from fedhet.data.datasets import load_dataset
        from fedhet.models import build_model

        data = load_dataset("wine")
        model = build_model(cfg.model.name, data.input_shape, data.num_classes, **cfg.model.params)
        minimal_s, minimal_rounds = minimal_flower_run(model.state_dict(), cfg.data.clients, args.rounds)
    rounds_s = sum(t["train_s"] + t.get("eval_s", 0.0) for t in timings)
    work_s = sum(t["flower_node_work_sum_s"] for t in timings)
    print(f"wine, 3 sites, {args.rounds} rounds, FedAvg, tabular-mlp, one torch thread per process")
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
    print(
        f"median round: fedhet on Flower {per_round:.3f} s (its nodes' training, summed: {node_work:.3f} s), "
        f"minimal Flower app {minimal_per_round:.3f} s: {per_round / minimal_per_round:.2f}x"
    )
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
    print(text.getvalue())
    if args.json:
        emit(
            "flower_table",
            {
                "flower_over_embedded": flower_s / embedded_s,
                "flower_over_minimal_flower": flower_s / minimal_s,
            },
            {},
            settings=f"wine, 3 sites, {args.rounds} rounds, FedAvg, one torch thread",
            rows=[
                {
                    "embedded_s": embedded_s,
                    "flower_s": flower_s,
                    "flower_rounds_s": rounds_s,
                    "minimal_flower_s": minimal_s,
                    "identical": same,
                }
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
