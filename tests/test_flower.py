"""fedhet on Flower: messages as records, Flower simulation equal to the embedded engine, a real deployment
on loopback (TLS, a node without the CA refused, a node killed mid-run), nodes with mismatched data
refused."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the Flower tests need fedhet[flower]; make setup installs it")

from flwr.app import RecordDict  # noqa: E402

from fedhet.algorithms import build_strategy  # noqa: E402
from fedhet.config import ExperimentConfig, to_toml  # noqa: E402
from fedhet.data.datasets import load_local_data  # noqa: E402
from fedhet.engine.checkpoint import checkpoints  # noqa: E402
from fedhet.engine.protocol import ClientState, Instruction, Reply  # noqa: E402
from fedhet.engine.rundir import live_owner  # noqa: E402
from fedhet.errors import ConfigError, DataError, ProtocolError  # noqa: E402
from fedhet.experiment import make_simulation  # noqa: E402
from fedhet.flower.records import (  # noqa: E402
    content_to_instruction,
    content_to_reply,
    instruction_to_content,
    load_state,
    reply_to_content,
    store_state,
)
from fedhet.flower.server import FlowerTransport, run_flower_simulation  # noqa: E402
from flower_cluster import BIN, flower_cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


# -- messages as records ----------------------------------------------------------------------------------
def test_instructions_replies_and_states_survive_the_records_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    ins = Instruction(
        weights={"w": torch.randn(3, 2, generator=gen), "steps": torch.tensor(7)},
        mask=torch.tensor([1.0, 0.0, 1.0]),
        payload={"prior": torch.rand(4, generator=gen, dtype=torch.float64)},
        config={"lr": 0.1, "keep": "head", "flag": True, "k": 3},
        delta=True,
    )
    back = content_to_instruction(instruction_to_content(ins))
    assert back.config == ins.config and back.delta and torch.equal(back.mask, ins.mask)
    for key, value in {**ins.weights, **ins.payload}.items():
        got = {**back.weights, **back.payload}[key]
        assert got.dtype == value.dtype and torch.equal(got, value)
    reply = Reply(weights={"w": torch.randn(2, generator=gen)}, num_examples=11, metrics={"loss": 0.5})
    again = content_to_reply(reply_to_content(reply))
    assert (
        again.num_examples == 11
        and again.metrics == {"loss": 0.5}
        and torch.equal(again.weights["w"], reply.weights["w"])
    )
    state = RecordDict()
    store_state(ClientState(weights={"head.weight": torch.ones(2, 3)}, values={"seen": [1, 2]}), state)
    kept = load_state(state)
    assert kept.values == {"seen": [1, 2]} and torch.equal(kept.weights["head.weight"], torch.ones(2, 3))
    store_state(ClientState(), state)
    assert load_state(state).weights is None
    with pytest.raises(ProtocolError, match="weights"):
        content_to_instruction(RecordDict())


# -- Flower simulation equals the embedded engine -----------------------------------------------------------
def tiny_config(method: str) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "dirichlet-per-client", 3
    cfg.data.split_params = {"alpha": 0.5}
    cfg.data.max_train_samples, cfg.data.max_test_samples = 900, 200
    cfg.train.rounds, cfg.train.local_steps, cfg.train.batch_size, cfg.train.threads = 3, 3, 16, 1
    cfg.eval.fairness = False
    cfg.method.name = method
    if method == "celm":  # three rounds: two of warm-up (backbone only, own heads), one frozen
        cfg.method.params = {"probe_steps": 5, "warmup_fraction": 0.67}
    if method == "fedrac":  # masks per node, a validation set and the standalone pre-pass
        cfg.data.validation_fraction = 0.1
        cfg.model.name, cfg.model.params = "mlp200", {"hidden_size": 12}
        cfg.method.params = {"candidate_step": 4, "candidate_step_late": 4}
        cfg.eval.fairness = "auto"
    if method == "fedavg-table":  # a table: federated standardisation on every node, tabular-mlp
        cfg.method.name = "fedavg"
        cfg.data.dataset, cfg.data.max_train_samples, cfg.data.max_test_samples = "wine", None, None
        cfg.model.name = "tabular-mlp"
    if method == "proxyfl":  # the prior in the payload, GPT on the server, a ResNet with BatchNorm
        cfg.data.split, cfg.data.split_params = "labeled-unlabeled", {"labeled_per_class": 10, "alpha": 0.5}
        cfg.model.name, cfg.model.params = "resnet8", {"width": 2}
        cfg.method.params = {"gpt_epochs": 2, "threshold": 0.5}
        cfg.train.batch_size = 8
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedavg", "celm", "fedrac", "proxyfl", "fedavg-table"])
def test_flower_simulation_gives_the_embedded_engines_results_bit_for_bit(tmp_path, method):
    cfg = tiny_config(method)
    flower = run_flower_simulation(cfg, tmp_path / "flower")
    embedded = make_simulation(cfg, run_dir=tmp_path / "embedded").run()
    # Tolerance zero, and rightly so: one code path (run_client, the same strategy, the sequential engine's
    # trainer) on one machine, the same seeded generators and start weights, replies in client-id order,
    # one torch thread on both sides, so the same operations run in the same order and every float agrees.
    assert (tmp_path / "flower" / "metrics.jsonl").read_bytes() == (
        tmp_path / "embedded" / "metrics.jsonl"
    ).read_bytes()
    assert flower["final"] == embedded["final"] and flower["contributions"] == embedded["contributions"]
    nodes = json.loads((tmp_path / "flower" / "flower_nodes.json").read_text())
    assert sorted(nodes["clients"]) == ["0", "1", "2"] and nodes["refused"] == {}
    # Flower's round in parts (timings.jsonl only): each node's handler holds its training, the exchange
    # waited for the handlers (at most one per CPU at a time), and the round holds the exchange.
    for name, file in (("flower", "timings.jsonl"), ("embedded", "timings.jsonl")):
        lines = [json.loads(s) for s in (tmp_path / name / file).read_text().splitlines()]
        assert len(lines) == cfg.train.rounds
        if name == "embedded":
            assert not any(k.startswith("flower_") for t in lines for k in t)
            continue
        for t in lines:
            assert 0 < t["flower_node_work_sum_s"] <= t["flower_node_handler_sum_s"]
            assert t["flower_exchange_s"] >= t["flower_node_handler_sum_s"] / min(os.cpu_count() or 1, 3)
            parts = t["flower_encode_s"] + t["flower_exchange_s"] + t["flower_decode_s"]
            assert 0 < parts <= t["train_s"]


@pytest.mark.slow
def test_injected_faults_act_on_flower_nodes_as_in_the_embedded_engine(tmp_path):
    cfg = tiny_config("fedavg")
    cfg.faults.clients = {"1": "scale", "2": "crash"}
    cfg.faults.factor = 3.0
    flower = run_flower_simulation(cfg, tmp_path / "flower")
    embedded = make_simulation(cfg, run_dir=tmp_path / "embedded").run()
    lines = {}
    for engine in ("flower", "embedded"):
        lines[engine] = [
            json.loads(s) for s in (tmp_path / engine / "metrics.jsonl").read_text().splitlines()
        ]
    for on_flower, here in zip(lines["flower"], lines["embedded"], strict=True):
        assert "crash" in on_flower.pop("failed")["2"] and "crash" in here.pop("failed")["2"]
        assert on_flower == here and on_flower["clients"] == [0, 1]  # the scaled update, bit for bit
    assert flower["final"] == embedded["final"]


def test_shared_memory_quirks_are_refused_on_flower_before_anything_starts(tmp_path):
    cfg = tiny_config("proxyfl")
    cfg.method.params = {**cfg.method.params, "shared_optimizer": True}
    started = time.monotonic()
    with pytest.raises(ConfigError, match="shared_optimizer"):
        run_flower_simulation(cfg, tmp_path / "run")
    assert time.monotonic() - started < 5  # refused before Ray starts


# -- nodes checked against the run --------------------------------------------------------------------------
RUN = {"config": "", "classes": ["a", "b", "c"], "input_shape": [1, 4, 4], "mean": [0.5], "std": [0.2]}


def test_a_node_with_mismatched_data_is_refused_with_its_node_and_the_mismatch():
    transport = FlowerTransport(None, RUN, num_clients=2)
    assert (
        transport._check_node(11, {"client-id": 0, "classes": ["a", "b", "c"], "input_shape": [1, 4, 4]}) == 0
    )
    transport.node_of[0] = 11
    with pytest.raises(ProtocolError, match=r"node 12 \(client 1\) holds inputs of shape \[3, 4, 4\]"):
        transport._check_node(12, {"client-id": 1, "classes": [], "input_shape": [3, 4, 4]})
    with pytest.raises(ProtocolError, match=r"node 13 \(client 1\) names its classes \['x', 'b'\]"):
        transport._check_node(13, {"client-id": 1, "classes": ["x", "b"], "input_shape": [1, 4, 4]})
    with pytest.raises(ProtocolError, match="node 14 and node 11 both say they are client 0"):
        transport._check_node(14, {"client-id": 0, "classes": [], "input_shape": [1, 4, 4]})
    with pytest.raises(ProtocolError, match="node 15 says it is client 5"):
        transport._check_node(15, {"client-id": 5, "classes": [], "input_shape": [1, 4, 4]})


def test_a_nodes_own_data_is_read_and_validated(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (6, 4, 4), dtype=np.uint8)
    (tmp_path / "npz").mkdir()
    np.savez(tmp_path / "npz" / "site.npz", x_train=images, y_train=np.array([0, 1, 2, 0, 1, 2]))
    arrays, named = load_local_data(tmp_path / "npz", channels=1)
    assert arrays.train_x.shape == (6, 1, 4, 4) and arrays.test_x.shape == (0, 1, 4, 4) and not named
    from PIL import Image

    for k, cls in enumerate(["cat", "dog"]):
        (tmp_path / "img" / "train" / cls).mkdir(parents=True)
        Image.fromarray(images[k]).save(tmp_path / "img" / "train" / cls / "0.png")
    arrays, named = load_local_data(tmp_path / "img", channels=1)
    assert arrays.classes == ("cat", "dog") and named and arrays.train_x.shape == (2, 1, 4, 4)
    with pytest.raises(DataError, match="neither a .npz file nor a train/ folder"):
        load_local_data(tmp_path / "img" / "train", channels=1)
    with pytest.raises(DataError, match="not a directory"):
        load_local_data(tmp_path / "missing", channels=1)
    np.savez(tmp_path / "npz" / "bad.npz", x_train=images)
    with pytest.raises(DataError, match="holds 2 .npz files"):
        load_local_data(tmp_path / "npz", channels=1)


def test_a_nodes_own_table_rows_are_standardised_with_the_runs_statistics(tmp_path):
    from fedhet.flower.client import _local_client_data

    rows = np.array([[1.0, 200.0], [3.0, 100.0], [5.0, 400.0]])  # kept as float32, not quantised
    (tmp_path / "site").mkdir()
    np.savez(tmp_path / "site" / "rows.npz", x_train=rows, y_train=np.array([0, 1, 0]))
    run = {"mean": [3.0, 250.0], "std": [2.0, 50.0]}
    for raw in (False, True):  # the semi-supervised trainers augment standardised rows (identity normalize)
        data, named = _local_client_data(
            str(tmp_path / "site"), 0, ["a", "b"], (2,), run, raw, torch.device("cpu")
        )
        expected = (rows - np.array(run["mean"])) / np.array(run["std"])  # by hand: (1-3)/2 = -1, ...
        assert np.allclose(data.inputs.numpy(), expected, atol=1e-6) and not named
        assert raw == (data.normalize is not None)
    with pytest.raises(DataError, match=r"rows have features \(2,\) but the run's model takes \(3,\)"):
        _local_client_data(str(tmp_path / "site"), 0, ["a", "b"], (3,), run, False, torch.device("cpu"))


# -- a real deployment on loopback ---------------------------------------------------------------------------
def deployment_config(rounds: int = 3) -> ExperimentConfig:
    cfg = tiny_config("celm")
    cfg.train.rounds = rounds
    return cfg


def write_node_data(cfg: ExperimentConfig, root: Path) -> list[Path]:
    """Each client's partition of the embedded engine's split as the node's own .npz (raw images), as
    ``fedhet partition CONFIG --export-sites`` writes it."""
    from fedhet.flower.sites import export_sites

    return [site.folder for site in export_sites(cfg, root)]


def app_copy(tmp_path: Path) -> Path:
    app = tmp_path / "app"
    shutil.copytree(
        ROOT / "examples" / "flower-app", app, ignore=shutil.ignore_patterns("runs", "__pycache__")
    )
    return app


def lines(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(s) for s in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.slow
def test_a_tls_deployment_stopped_with_flwr_stop_and_resumed_equals_the_embedded_engine(tmp_path):
    cfg = deployment_config(rounds=4)
    cfg.method.params = {**cfg.method.params, "warmup_fraction": 0.5}  # warm-up rounds 1-2, then frozen
    folders = write_node_data(cfg, tmp_path / "data")
    (tmp_path / "fedhet.toml").write_text(to_toml(cfg))
    run_dir = tmp_path / "run"
    run_config = {"config": str(tmp_path / "fedhet.toml"), "run-dir": str(run_dir), "connect-timeout": 30.0}
    with flower_cluster(tmp_path / "cluster", tls=True) as cluster:
        for cid, folder in enumerate(folders):
            cluster.add_node(cid, folder, warm=True)  # fedhet's warm SuperExec (the walkthrough: Flower's)
        cluster.add_node(1, folders[1], trusted=False, name="untrusted")  # no CA certificate
        for cid in range(3):
            cluster.wait_for(f"node{cid}", "SuperNode ID")
        import subprocess

        # the first run is stopped with flwr stop once round 2 is done (after the warm-up: no node state lost)
        flwr = {"env": cluster.env, "cwd": cluster.root, "capture_output": True, "text": True, "timeout": 120}
        overrides = " ".join(f"{k}={v!r}" for k, v in run_config.items())
        submitted = subprocess.run(  # without --stream, flwr run returns once the run is submitted
            [str(BIN / "flwr"), "run", str(app_copy(tmp_path)), "test", "--run-config", overrides], **flwr
        ).stdout
        run_id = re.search(r"Successfully started run (\d+)", submitted).group(1)
        deadline = time.monotonic() + 300
        while len(lines(run_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        stopped = subprocess.run([str(BIN / "flwr"), "stop", run_id, "test"], **flwr)
        assert "successfully stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        # the ServerApp saves the last round it finished and exits (its lock on the folder goes with it)
        deadline = time.monotonic() + 60
        while (not checkpoints(run_dir) or live_owner(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.3)
        done_before = [m["round"] for m in lines(run_dir)]
        assert 2 <= len(done_before) < 4 and not (run_dir / "summary.json").exists(), done_before
        assert [p.name for p in checkpoints(run_dir)] == [f"round_{done_before[-1]:05d}"]
        assert live_owner(run_dir) is None
        done = cluster.flwr_run(app_copy(tmp_path / "again"), {**run_config, "resume": True}, timeout=400)
        assert (run_dir / "summary.json").is_file(), (
            done.stdout[-3000:] + done.stderr[-3000:] + cluster.log("superlink")[-3000:]
        )
        assert f"fedhet: resumed {run_dir} from round {done_before[-1]}" in done.stdout, done.stdout[-3000:]
        # the node without the CA failed the TLS handshake and gave up; it never joined
        cluster.processes["untrusted"].wait(timeout=60)
        assert "CERTIFICATE_VERIFY_FAILED" in cluster.log("untrusted")
    nodes = json.loads((run_dir / "flower_nodes.json").read_text())
    assert sorted(nodes["clients"]) == ["0", "1", "2"] and nodes["refused"] == {}
    embedded = make_simulation(cfg, run_dir=tmp_path / "embedded").run()
    assert (run_dir / "metrics.jsonl").read_bytes() == (tmp_path / "embedded" / "metrics.jsonl").read_bytes()
    assert json.loads((run_dir / "summary.json").read_text())["contributions"] == embedded["contributions"]


@pytest.mark.slow
def test_a_node_killed_after_round_one_is_reported_and_the_run_completes(tmp_path):
    cfg = deployment_config()
    folders = write_node_data(cfg, tmp_path / "data")
    (tmp_path / "fedhet.toml").write_text(to_toml(cfg))
    run_dir = tmp_path / "run"
    with flower_cluster(tmp_path / "cluster") as cluster:
        for cid, folder in enumerate(folders):
            cluster.add_node(cid, folder, warm=True)
        for cid in range(3):
            cluster.wait_for(f"node{cid}", "SuperNode ID")
        import subprocess
        import threading

        result: dict = {}
        runner = threading.Thread(
            target=lambda: result.update(
                done=cluster.flwr_run(
                    app_copy(tmp_path),
                    {
                        "config": str(tmp_path / "fedhet.toml"),
                        "run-dir": str(run_dir),
                        "round-timeout": 120.0,
                        "connect-timeout": 30.0,
                    },
                    timeout=400,
                )
            )
        )
        runner.start()
        deadline = time.monotonic() + 300
        while not lines(run_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert lines(run_dir), cluster.log("superlink")[-3000:]
        cluster.stop("node2")  # the site holding client 2 goes away after round 1
        runner.join(timeout=400)
        assert not runner.is_alive()
        assert isinstance(result.get("done"), subprocess.CompletedProcess)
        # what the ServerApp logged reaches Flower's log: the stream of flwr run, and flwr log afterwards
        streamed = result["done"].stdout
        run_id = re.search(r"Successfully started run (\d+)", streamed).group(1)
        logged = subprocess.run(
            [str(BIN / "flwr"), "log", run_id, "test"],
            env=cluster.env, cwd=cluster.root, capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        for text in (streamed, logged):
            assert "fedhet: round 1/3: accuracy " in text, text[-3000:]
            assert re.search(r"fedhet: round 2/3: .*failed: client 2 \(node \d+\)", text), text[-3000:]
            assert f"fedhet: run folder: {run_dir}" in text and "fedhet: contributions: client 0" in text
        # a failed server run (its run folder is finished, not to be overwritten) says so in the stream
        again = cluster.flwr_run(
            app_copy(tmp_path / "again"),
            {"config": str(tmp_path / "fedhet.toml"), "run-dir": str(run_dir), "connect-timeout": 30.0},
            timeout=200,
        )
        assert f"fedhet: the run failed: RunDirectoryError: run directory {run_dir}" in again.stdout, (
            again.stdout[-3000:]
        )
    metrics = lines(run_dir)
    assert [m["round"] for m in metrics] == [1, 2, 3]
    assert metrics[0]["clients"] == [0, 1, 2] and "failed" not in metrics[0]
    # the stopped node is offline for Flower at once (a node killed outright: within 2 heartbeats, 60 s;
    # benchmarks/flower_offline.py): its client fails each later round without waiting for round-timeout
    seconds = [json.loads(s)["train_s"] for s in (run_dir / "timings.jsonl").read_text().splitlines()]
    for m, took in zip(metrics[1:], seconds[1:], strict=True):
        assert m["clients"] == [0, 1] and set(m["failed"]) == {"2"}
        assert re.fullmatch(r"node \d+ (went offline: Flower heard no heartbeat .*|is no longer connected)",
                            m["failed"]["2"]), m["failed"]  # fmt: skip
        assert took < 120.0 / 2, seconds
    assert json.loads((run_dir / "summary.json").read_text())["final"]["accuracy"] > 0.1


def test_the_example_app_points_at_fedhets_components():
    import tomllib

    project = tomllib.loads((ROOT / "examples" / "flower-app" / "pyproject.toml").read_text())
    components = project["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "app:server_app", "clientapp": "app:client_app"}
    config = project["tool"]["flwr"]["app"]["config"]
    from fedhet.config import load_config

    cfg = load_config(ROOT / "examples" / "flower-app" / config["config"])
    build_strategy(cfg.method.name, cfg.method.params)
