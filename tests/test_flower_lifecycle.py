"""A Flower run's life (fedhet.flower.lifecycle): checkpoints as in the embedded engine, a run stopped after a
round and resumed on fresh nodes ends with the embedded run's metrics line for line, a resume that would need
what the nodes kept is refused, a Flower run folder is never rerun by the embedded engine, and a node Flower
reports offline fails its round at once, by name. fedhet's real ClientApps answer through the in-process
loopback Grid (tests/flower_loopback.py): no Ray, no network."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr", reason="the Flower tests need fedhet[flower]; make setup installs it")

from flwr.app import Context, RecordDict  # noqa: E402
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message  # noqa: E402

import fedhet  # noqa: E402
from fedhet.algorithms import build_strategy  # noqa: E402
from fedhet.engine.checkpoint import checkpoints  # noqa: E402
from fedhet.errors import ConfigError  # noqa: E402
from fedhet.experiment import make_simulation  # noqa: E402
from fedhet.flower.client import make_client_app  # noqa: E402
from fedhet.flower.server import FlowerServer, make_server_app  # noqa: E402
from flower_loopback import LoopbackGrid, server_identity  # noqa: E402
from support import digits_config, lines_of  # noqa: E402


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def celm_config(rounds: int = 4):
    """CELM on digits, 3 clients: warm-up rounds 1-2 (nodes keep their heads), then frozen (full model)."""
    return digits_config(
        clients=3,
        rounds=rounds,
        method__name="celm",
        method__params={"probe_steps": 5, "warmup_fraction": 0.5},
    )


def nodes(first: int) -> LoopbackGrid:
    """Three fresh fedhet nodes (simulation style: partition i), node ids first..first+2, empty states."""
    app = make_client_app()
    return LoopbackGrid({first + i: (app, {"partition-id": i, "num-partitions": 3}) for i in range(3)})


class Stop(Exception):
    """What stops the run in these tests (as flwr stop or a lost SuperLink would, from outside the loop)."""


def stop_after(k: int):
    def progress(rnd, rounds, line):
        if rnd == k:
            raise Stop(f"stopped after round {k}")

    return progress


def flower_run(cfg, run_dir, grid, **kwargs):
    with server_identity():
        return FlowerServer(
            cfg, build_strategy(cfg.method.name, cfg.method.params), grid, run_dir=run_dir, connect_timeout=0,
            **kwargs,
        ).run()  # fmt: skip


def test_a_flower_run_stopped_after_a_round_resumes_on_fresh_nodes_to_the_embedded_runs_metrics(tmp_path):
    cfg = celm_config()
    embedded = make_simulation(cfg, run_dir=tmp_path / "embedded").run()
    run = tmp_path / "flower"
    with pytest.raises(Stop):
        flower_run(cfg, run, nodes(101), progress=stop_after(3))
    # the stop saved round 3 (checkpoints fall every 10 rounds): nothing finished is lost
    assert [p.name for p in checkpoints(run)] == ["round_00003"]
    assert [m["round"] for m in lines_of(run)] == [1, 2, 3] and not (run / "summary.json").exists()
    # other node ids, empty node states: the nodes of a new Flower run
    summary = flower_run(cfg, run, nodes(201), resume=True)
    # tolerance zero: one code path on one machine (run_client, the same strategy state restored from the
    # checkpoint, seeded generators per round and client, one torch thread), as the bit-identity tests hold
    assert (run / "metrics.jsonl").read_bytes() == (tmp_path / "embedded" / "metrics.jsonl").read_bytes()
    assert summary["contributions"] == embedded["contributions"] and summary["final"] == embedded["final"]
    assert json.loads((run / "flower_nodes.json").read_text())["clients"] == {"0": 201, "1": 202, "2": 203}
    # the same checkpoint files as the embedded engine writes (the last round's, and the stop's)
    assert [p.name for p in checkpoints(run)] == ["round_00004", "round_00003"]
    assert [p.name for p in checkpoints(tmp_path / "embedded")] == ["round_00004"]


def test_flowers_own_exit_saves_the_last_finished_round_before_its_force_exit_timer_starts(tmp_path):
    from flwr.supercore.exit.exit_handler import trigger_exit_handlers

    run, saved = tmp_path / "flower", []

    def progress(rnd, rounds, line):  # flwr stop: the ServerApp's flwr_exit runs these handlers first
        if rnd == 3:
            trigger_exit_handlers(run_before_force_exit=True)
            saved.extend(p.name for p in checkpoints(run))
            raise Stop

    with pytest.raises(Stop):
        flower_run(celm_config(), run, nodes(101), progress=progress)
    assert saved == ["round_00003"]  # on disk before anything unwinds (Flower force-exits 5 s later)


def test_a_resume_that_needs_what_the_nodes_kept_is_refused_and_overwrite_starts_again(tmp_path):
    cfg = celm_config()
    run = tmp_path / "flower"
    with pytest.raises(Stop):
        flower_run(cfg, run, nodes(101), progress=stop_after(1))
    # round 2 is warm-up: the server sends the backbone only, each node's own head stayed in its old state
    with pytest.raises(
        ConfigError, match=r"round 2 needs what client 0's node kept between rounds \(its head"
    ):
        flower_run(cfg, run, nodes(201), resume=True)
    assert [m["round"] for m in lines_of(run)] == [1]  # the folder is as the stop left it
    flower_run(cfg, run, nodes(301), overwrite=True)
    assert [m["round"] for m in lines_of(run)] == [1, 2, 3, 4]


def test_a_flower_run_folder_is_never_rerun_by_the_embedded_engine_nor_the_reverse(tmp_path):
    cfg = celm_config(rounds=2)
    with pytest.raises(Stop):
        flower_run(cfg, tmp_path / "flower", nodes(101), progress=stop_after(1))
    with pytest.raises(ConfigError, match=r"holds a Flower run .*resume=true in flwr run's --run-config"):
        fedhet.run(out=tmp_path / "flower", resume=True)
    assert [m["round"] for m in lines_of(tmp_path / "flower")] == [1]
    make_simulation(cfg, run_dir=tmp_path / "embedded").run()  # its checkpoints hold its clients' states
    with pytest.raises(ConfigError, match="holds a run of the embedded engine.*fedhet run --resume"):
        flower_run(cfg, tmp_path / "embedded", nodes(201), resume=True)


def test_resume_and_overwrite_in_the_run_config_are_true_or_false_and_not_both(tmp_path):
    app = make_server_app(celm_config(rounds=1), run_dir=tmp_path / "run")

    def context(**run_config):
        return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config)

    with server_identity(), pytest.raises(ConfigError, match=r"resume='yes' in flwr run's --run-config"):
        app(nodes(101), context(resume="yes"))
    with server_identity(), pytest.raises(ConfigError, match="resume and overwrite exclude each other"):
        app(nodes(101), context(resume=True, overwrite=True))


class OfflineNode(LoopbackGrid):
    """Node ``offline`` has gone: Flower's SuperLink answers each message to it with its own NODE_UNAVAILABLE
    error (flwr's function that builds that answer), from the SuperLink's node id."""

    def __init__(self, grid: LoopbackGrid, offline: int) -> None:
        self.__dict__.update(grid.__dict__)
        self.offline = offline

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        gone = [m for m in messages if m.metadata.dst_node_id == self.offline and m.metadata.group_id != "0"]
        answered = super().send_and_receive([m for m in messages if m not in gone])  # it described itself
        return answered + [
            create_message_error_unavailable_res_message(m.metadata, "node_unavail") for m in gone
        ]


def test_a_node_flower_reports_offline_fails_its_round_by_name_and_the_round_goes_on(tmp_path, caplog):
    cfg = digits_config(clients=3, rounds=2)
    with caplog.at_level("WARNING", logger="fedhet"):
        flower_run(cfg, tmp_path / "run", OfflineNode(nodes(101), offline=103))
    for line in lines_of(tmp_path / "run"):
        assert line["clients"] == [0, 1]
        reason = "node 103 went offline: Flower heard no heartbeat from it within 2 × 30 s (or it stopped)"
        assert line["failed"] == {"2": reason}
    assert "round 1: client 2 (node 103) failed: node 103 went offline" in caplog.text


def test_a_run_whose_faults_keep_a_memory_on_the_nodes_is_not_resumed_on_flower(tmp_path):
    cfg = digits_config(clients=3, rounds=2, faults__clients={"1": "replay"})
    with pytest.raises(ConfigError, match=r"injects faults \(replay\) whose memory lives in the nodes"):
        flower_run(cfg, tmp_path / "run", nodes(101), resume=True)
