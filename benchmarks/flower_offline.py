"""How long a Flower deployment round waits for a node that is killed: Flower's own offline detection.

Starts a SuperLink and three SuperNodes on 127.0.0.1 (insecure, each in its own process group, all stopped
at the end: tests/flower_cluster.py), submits a FedAvg run on digits (3 clients, ``--rounds`` rounds) with
``round-timeout`` 600 s (the example app's default), SIGKILLs the node of client 2 as soon as round 1 is
written, and prints the seconds from the kill to the end of the round then in flight, each round's seconds
(``timings.jsonl``'s ``train_s``) and what ``metrics.jsonl`` records for client 2. A killed node says no
goodbye: the SuperLink counts it offline once its heartbeats stop for Flower's patience × interval, and
then answers for it (docs/flower.md, "A node that goes offline").

    python benchmarks/flower_offline.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's loopback cluster: one place starts and stops it

ROUND_TIMEOUT = 600.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from fedhet.config import ExperimentConfig, to_toml
    from fedhet.flower.sites import export_sites
    from flower_cluster import flower_cluster

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["FEDHET_CACHE"] = str(root / "cache")
        cfg = ExperimentConfig()
        cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", "iid", 3
        cfg.train.rounds, cfg.train.local_steps, cfg.train.threads = args.rounds, 3, 1
        cfg.eval.fairness = False
        (root / "fedhet.toml").write_text(to_toml(cfg))
        folders = [site.folder for site in export_sites(cfg, root / "data")]
        run_dir = root / "run"
        metrics = run_dir / "metrics.jsonl"

        def written() -> int:
            return len(metrics.read_text().splitlines()) if metrics.is_file() else 0

        with flower_cluster(root / "cluster") as cluster:
            for cid, folder in enumerate(folders):
                cluster.add_node(cid, folder)
            for cid in range(3):
                cluster.wait_for(f"node{cid}", "SuperNode ID")
            run_config = {
                "config": str(root / "fedhet.toml"),
                "run-dir": str(run_dir),
                "round-timeout": ROUND_TIMEOUT,
                "connect-timeout": 60.0,
            }
            app = root / "app"  # a copy: flwr run packs the folder, runs of the example app stay out
            shutil.copytree(ROOT / "examples" / "flower-app", app, ignore=shutil.ignore_patterns("runs"))
            runner = threading.Thread(target=cluster.flwr_run, args=(app, run_config, 3600))
            runner.start()
            deadline = time.monotonic() + 600
            while written() < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            os.killpg(cluster.processes["node2"].pid, signal.SIGKILL)
            killed = time.monotonic()
            while written() < 2 and time.monotonic() < killed + 2 * ROUND_TIMEOUT:
                time.sleep(0.1)
            in_flight = time.monotonic() - killed
            runner.join(timeout=3600)
        timings = [json.loads(s) for s in (run_dir / "timings.jsonl").read_text().splitlines()]
        lines = [json.loads(s) for s in metrics.read_text().splitlines()]
    print(f"round-timeout {ROUND_TIMEOUT:g} s; client 2's node SIGKILLed once round 1 was written")
    print(f"from the kill to the end of round 2 (in flight): {in_flight:.1f} s")
    for t, m in zip(timings, lines, strict=True):
        print(
            f"round {t['round']}: {t['train_s']:.1f} s; client 2: {m.get('failed', {}).get('2', 'replied')}"
        )


if __name__ == "__main__":
    main()
