"""A Flower deployment round of fedhet against a minimal Flower app's, and against the embedded engine.

On 127.0.0.1 (insecure, free ports): one SuperLink and three SuperNodes, each node started with the node
config of its site as the one-host walkthrough of docs/flower.md exports it (``fedhet partition
examples/flower-app/wine.toml --export-sites``: wine, three Dirichlet sites, FedAvg, tabular-mlp; the nodes
read their own CSV, ``node-tables=true``). On these nodes, ``--repeats`` times in turn:

- **the minimal Flower app** (benchmarks/flower_echo_app/): a ServerApp that sends every node an ArrayRecord
  holding the walkthrough model's weights and a ClientApp that returns its input unchanged, ``--rounds``
  exchanges after a first one; each exchange timed in the ServerApp around ``grid.send_and_receive``;
- **fedhet's walkthrough run** (examples/flower-app, the same config with ``--rounds`` rounds); each round
  timed by the round loop (``timings.jsonl``: ``train_s`` + ``eval_s``, the exchange and the server's
  evaluation; ``flower_exchange_s`` is the exchange alone);

and the embedded engine on the same config in this process (one torch thread, as the nodes use; a warm-up
run first; rounds timed the same way). Per-round figures are medians over the rounds, start-up excluded (the
SuperNodes joining, the table reports and the describe exchange, the minimal app's first exchange). The run's
metrics.jsonl must equal the embedded run's, byte for byte.

Flower 1.42's deployment carries a round in steps of its pollers: the SuperNode asks the SuperLink for a
message every 3 s while it has none, the ServerApp's ``send_and_receive`` asks for the replies every 3 s,
and the SuperNode starts a new ``flwr-clientapp`` process for each message (process isolation), which
installs the app and imports it before it answers. No app's round is shorter than one 3 s poll.

Every process is started in its own process group and stopped by its pid when the block ends
(tests/flower_cluster.py), every wait bounded.

    python benchmarks/flower_rounds.py [--rounds 5] [--repeats 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import emit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's loopback cluster: one place starts and stops it

APP = ROOT / "examples" / "flower-app"
ECHO_APP = Path(__file__).resolve().parent / "flower_echo_app"
RUN_TIMEOUT_S = 900.0


def round_seconds(run_dir: Path) -> tuple[list[float], list[float]]:
    """Each round's seconds (train + eval, from the round loop's timings.jsonl) and its Flower exchange."""
    timings = [json.loads(s) for s in (run_dir / "timings.jsonl").read_text().splitlines()]
    rounds = [t["train_s"] + t.get("eval_s", 0.0) for t in timings]
    return rounds, [t.get("flower_exchange_s", 0.0) for t in timings]


def submit(cluster, app: Path, run_config: dict, expect: Path) -> float:
    """``flwr run`` the app on the cluster; its wall seconds. Raises with the log when ``expect`` is not
    written."""
    started = time.perf_counter()
    done = cluster.flwr_run(app, run_config, RUN_TIMEOUT_S)
    wall = time.perf_counter() - started
    if not expect.is_file():
        raise RuntimeError(
            f"flwr run {app.name} wrote no {expect.name} (exit {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-3000:]}\n{cluster.log('superlink')[-2000:]}"
        )
    return wall


def start_nodes(cluster, sites, *, warm: bool) -> None:
    """One SuperNode per site; ``warm``: each with ``--isolation process`` and fedhet's warm SuperExec
    (fedhet.flower.node_exec) beside it, else Flower's own (the node starts ``flower-superexec``)."""
    from flower_cluster import BIN, free_port

    for site in sites:
        port = free_port()
        args = [
            str(BIN / "flower-supernode"),
            "--superlink",
            f"127.0.0.1:{cluster.port}",
            "--port",
            str(port),
        ]
        args += ["--insecure", "--node-config", site.node_config]
        if warm:
            args += ["--isolation", "process"]
        cluster.start(f"node{site.cid}", args)
        if warm:
            exec_args = [
                "-m",
                "fedhet.flower.node_exec",
                "--insecure",
                "--runtime-api-address",
                f"127.0.0.1:{port}",
            ]
            cluster.start(f"exec{site.cid}", [sys.executable, *exec_args])
    for site in sites:
        cluster.wait_for(f"node{site.cid}", "SuperNode ID")


def measure(root: Path, sites, app: Path, echo: Path, args, *, warm: bool) -> dict:
    """On a fresh SuperLink and nodes: ``args.repeats`` times, the minimal app's run, then fedhet's."""
    from flower_cluster import flower_cluster

    kind = "warm" if warm else "flower"
    out: dict = {"minimal": [], "fedhet": [], "exchange": [], "walls": {"minimal": [], "fedhet": []}}
    out["run_dirs"] = []
    with flower_cluster(root / f"cluster-{kind}") as cluster:
        start_nodes(cluster, sites, warm=warm)
        for k in range(args.repeats):
            result = root / f"echo-{kind}-{k}.json"
            run_config = {"weights": str(root / "weights.npz"), "out": str(result), "rounds": args.rounds}
            out["walls"]["minimal"].append(submit(cluster, echo, run_config | {"nodes": len(sites)}, result))
            out["minimal"] += json.loads(result.read_text())["round_s"]
            run_dir = root / f"flower-{kind}-{k}"
            run_config = {
                "config": "bench.toml",
                "run-dir": str(run_dir),
                "node-tables": True,
                "round-timeout": 600.0,
                "connect-timeout": 120.0,
            }
            out["walls"]["fedhet"].append(submit(cluster, app, run_config, run_dir / "summary.json"))
            rounds, exchanges = round_seconds(run_dir)
            out["fedhet"] += rounds
            out["exchange"] += exchanges
            out["run_dirs"].append(run_dir)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each app, in turn, on the same nodes")
    parser.add_argument("--json", action="store_true", help="end with the JSON result line")
    args = parser.parse_args()

    import numpy as np
    import torch

    from fedhet.code_version import commit
    from fedhet.config import load_config, to_toml
    from fedhet.data.datasets import load_dataset
    from fedhet.experiment import make_simulation
    from fedhet.flower.sites import export_sites
    from fedhet.models import build_model

    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]  # the machine's load: these rounds wait on processes starting
    cfg = load_config(APP / "wine.toml")
    cfg.train.rounds = args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["FEDHET_CACHE"] = str(root / "cache")
        make_simulation(cfg, run_dir=root / "warm-up").run()  # data and code paths warm
        make_simulation(cfg, run_dir=root / "embedded").run()
        embedded, _ = round_seconds(root / "embedded")
        sites = export_sites(cfg, root / "sites")
        app, echo = root / "app", root / "echo"  # copies: flwr run packs the folder
        shutil.copytree(APP, app, ignore=shutil.ignore_patterns("runs", "__pycache__"))
        shutil.copytree(ECHO_APP, echo, ignore=shutil.ignore_patterns("__pycache__"))
        (app / "bench.toml").write_text(to_toml(cfg))
        data = load_dataset(cfg.data.dataset)
        model = build_model(cfg.model.name, data.input_shape, data.num_classes, **cfg.model.params)
        np.savez(root / "weights.npz", **{k: v.numpy() for k, v in model.state_dict().items()})
        runs = {
            kind: measure(root, sites, app, echo, args, warm=kind == "warm") for kind in ("flower", "warm")
        }
        expected = (root / "embedded" / "metrics.jsonl").read_bytes()
        same = all(
            (d / "metrics.jsonl").read_bytes() == expected for r in runs.values() for d in r["run_dirs"]
        )

    load_after = os.getloadavg()[0]
    load = f"load average {load_before:.1f} at the start, {load_after:.1f} at the end, {os.cpu_count()} CPUs"
    med = statistics.median
    flower, warm = runs["flower"], runs["warm"]
    floor = med(flower["minimal"])  # Flower's own round: the echo app on nodes as Flower starts them
    m = {
        "embedded": med(embedded),
        "fedhet": med(flower["fedhet"]),
        "fedhet_warm": med(warm["fedhet"]),
        "minimal_warm": med(warm["minimal"]),
    }
    at = commit(ROOT, ("src", "benchmarks", "examples"))
    print(
        "wine walkthrough (FedAvg, tabular-mlp, 3 SuperNodes on 127.0.0.1, node-tables), "
        f"{args.rounds} rounds, {args.repeats} run(s) of each app on each kind of node; commit {at}; {load}"
    )

    def show(label: str, values: list[float], digits: int = 2) -> None:
        print(f"  {label:44s} {' '.join(f'{v:.{digits}f}' for v in values)}  median {med(values):.{digits}f}")

    print("per-round seconds (start-up excluded; fedhet: train + eval from timings.jsonl):")
    show("minimal Flower app (echo), Flower's nodes", flower["minimal"])
    show("fedhet, Flower's nodes", flower["fedhet"])
    show("  its Flower exchange", flower["exchange"])
    show("fedhet, warm nodes (fedhet.flower.node_exec)", warm["fedhet"])
    show("  its Flower exchange", warm["exchange"])
    show("minimal Flower app (echo), warm nodes", warm["minimal"])
    show("embedded engine", embedded, 3)
    for kind, r in runs.items():
        walls = {name: ", ".join(f"{s:.1f}" for s in seconds) for name, seconds in r["walls"].items()}
        print(f"whole runs on {kind} nodes (flwr run, start-up included): minimal {walls['minimal']} s; "
              f"fedhet {walls['fedhet']} s")  # fmt: skip
    ratios = {
        "fedhet_over_minimal_flower_round": m["fedhet"] / floor,
        "fedhet_warm_over_minimal_flower_round": m["fedhet_warm"] / floor,
        "fedhet_warm_over_minimal_warm_round": m["fedhet_warm"] / m["minimal_warm"],
        "deployment_over_embedded_round": m["fedhet"] / m["embedded"],
        "deployment_warm_over_embedded_round": m["fedhet_warm"] / m["embedded"],
    }
    print(
        "fedhet / minimal Flower app per round, Flower's nodes: "
        f"{ratios['fedhet_over_minimal_flower_round']:.2f}x"
    )
    print(
        f"fedhet on warm nodes / minimal Flower app on Flower's nodes: "
        f"{ratios['fedhet_warm_over_minimal_flower_round']:.2f}x (target <= 1.5); beyond it "
        f"{m['fedhet_warm'] - floor:+.2f} s a round"
    )
    print(
        "fedhet / minimal Flower app, both on warm nodes: "
        f"{ratios['fedhet_warm_over_minimal_warm_round']:.2f}x"
    )
    print(
        f"deployment / embedded per round: {ratios['deployment_over_embedded_round']:.0f}x (Flower's nodes), "
        f"{ratios['deployment_warm_over_embedded_round']:.0f}x (warm nodes)"
    )
    print(f"metrics.jsonl of every deployment run equals the embedded run's: {same}")
    if args.json:
        emit(
            "flower_rounds",
            ratios,
            {"fedhet_warm_over_minimal_flower_round": "<= 1.5"},
            settings=(
                f"wine walkthrough, 3 SuperNodes on 127.0.0.1, {args.rounds} rounds x {args.repeats} run(s) "
                f"per app and kind of node; per-round medians, start-up excluded; {load}"
            ),
            rows=[{"minimal_round_s": floor, **{f"{k}_round_s": v for k, v in m.items()}, "identical": same}],
            commit=at,
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
