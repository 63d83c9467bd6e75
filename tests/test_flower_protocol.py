"""The public protocol of a fedhet server on Flower (docs/flower.md, "Your own ClientApp"): a ClientApp
written by hand (a plain torch model, fedhet.flower.records' helpers) trains with a fedhet ServerApp; a
reply missing a required field, or with a malformed one, is refused naming the field and the node, and the
round goes on with the others. The server's messages reach the ClientApps through an in-process loopback
Grid (tests/flower_loopback.py): no Ray, no network."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("flwr", reason="the Flower tests need fedhet[flower]; make setup installs it")

from flwr.app import ConfigRecord, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402

from fedhet.algorithms import build_strategy  # noqa: E402
from fedhet.config import ExperimentConfig  # noqa: E402
from fedhet.engine.protocol import Reply  # noqa: E402
from fedhet.engine.simulation import build_federation  # noqa: E402
from fedhet.errors import ProtocolError, RunDirectoryError  # noqa: E402
from fedhet.flower.records import (  # noqa: E402
    RUN_RECORD,
    content_to_instruction,
    content_to_reply,
    description_to_content,
    reply_to_content,
)
from fedhet.flower.server import FlowerServer, make_server_app  # noqa: E402
from fedhet.flower.server_log import round_text  # noqa: E402
from fedhet.models import register  # noqa: E402
from flower_loopback import LoopbackGrid, server_identity  # noqa: E402

pytestmark = pytest.mark.usefixtures("forget_registrations")  # its registrations stay in it


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


class PlainNet(nn.Module):
    """Any nn.Module will do for FedAvg: this one knows nothing of fedhet."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(features, 32)
        self.out = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x.flatten(1))))


def plain_net(input_shape, num_classes):
    return PlainNet(int(np.prod(input_shape)), num_classes)


def digits_config(rounds: int = 2) -> ExperimentConfig:
    register("plain-net-protocol-test", plain_net, overwrite=True)
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", "iid", 3
    cfg.model.name = "plain-net-protocol-test"
    cfg.train.rounds, cfg.train.threads = rounds, 1
    cfg.eval.fairness = False
    return cfg


def own_client_app(inputs: torch.Tensor, labels: torch.Tensor, cid: int, spoil: Callable | None) -> ClientApp:
    """A ClientApp written from docs/flower.md alone: describe, then SGD on a PlainNet from the sent weights
    (``spoil`` breaks the reply it sends)."""
    app = ClientApp()

    @app.query()
    def describe(message: Message, context) -> Message:
        run = dict(message.content[RUN_RECORD])
        counts = torch.bincount(labels, minlength=len(run["classes"]))
        return Message(
            description_to_content(cid, len(labels), counts, list(inputs.shape[1:])), reply_to=message
        )

    @app.train()
    def train(message: Message, context) -> Message:
        ins = content_to_instruction(message.content)
        model = PlainNet(int(np.prod(inputs.shape[1:])), int(labels.max()) + 1)
        model.load_state_dict(ins.weights)
        opt = torch.optim.SGD(model.parameters(), lr=float(ins.config["lr"]))
        gen = torch.Generator().manual_seed(cid)
        for _ in range(20):
            batch = torch.randint(len(labels), (32,), generator=gen)
            loss = nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        reply = Reply(
            weights=model.state_dict(), num_examples=len(labels), metrics={"train_loss": loss.item()}
        )
        content = reply_to_content(reply)
        if spoil is not None:
            spoil(content)
        return Message(content, reply_to=message)

    return app


def run_with_own_apps(cfg, tmp_path, spoil_client_2: Callable | None = None):
    """FlowerServer over a loopback Grid of three hand-written ClientApps (nodes 101..103, client i on node
    101 + i); returns the metrics lines."""
    fed = build_federation(cfg, torch.device("cpu"))
    nodes = {}
    for client in fed.clients:
        x, y = client.inputs[client.indices], client.labels[client.indices]
        spoil = spoil_client_2 if client.cid == 2 else None
        nodes[101 + client.cid] = (own_client_app(x, y, client.cid, spoil), {})
    strategy = build_strategy(cfg.method.name, cfg.method.params)
    with server_identity():
        FlowerServer(cfg, strategy, LoopbackGrid(nodes), run_dir=tmp_path / "run", connect_timeout=0).run()
    return [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_a_hand_written_client_app_with_a_plain_torch_model_trains_with_a_fedhet_server(tmp_path):
    lines = run_with_own_apps(digits_config(), tmp_path)
    assert [m["round"] for m in lines] == [1, 2]
    assert all(m["clients"] == [0, 1, 2] and "failed" not in m and "rejected" not in m for m in lines)
    # 10 classes: chance is 10 %; two rounds of 20 SGD steps per client reach far above it (measured 0.869)
    assert lines[-1]["accuracy"] > 0.5
    nodes = json.loads((tmp_path / "run" / "flower_nodes.json").read_text())
    assert nodes == {"clients": {"0": 101, "1": 102, "2": 103}, "refused": {}}


def _drop(record: str, key: str | None = None):
    def spoil(content: RecordDict) -> None:
        if key is None:
            del content[record]
        else:
            kept = {k: v for k, v in content[record].items() if k != key}
            content[record] = ConfigRecord(kept)

    return spoil


def _num_examples(value):
    def spoil(content: RecordDict) -> None:
        content["reply"] = ConfigRecord({"num_examples": value})

    return spoil


def _weights(change):
    def spoil(content: RecordDict) -> None:
        weights = content_to_reply(content).weights
        content["weights"] = reply_to_content(Reply(weights=change(weights), num_examples=1))["weights"]

    return spoil


NODE = "node 103: the reply"
SPOILED = {  # case: (how client 2 spoils its reply, how the server counts it, the reason it records)
    "no weights record": (_drop("weights"), "failed", f"{NODE} holds no 'weights' record"),
    "no reply record": (_drop("reply"), "failed", f"{NODE} holds no 'reply' record"),
    "no num_examples": (
        _drop("reply", "num_examples"),
        "failed",
        f"{NODE}'s 'reply' record holds no 'num_examples'",
    ),
    "num_examples a string": (
        _num_examples("40"),
        "failed",
        f"{NODE}'s num_examples='40' must be an integer",
    ),
    "num_examples negative": (_num_examples(-1), "failed", f"{NODE}'s num_examples=-1 must be an integer"),
    "a weight missing": (
        _weights(lambda w: {k: v for k, v in w.items() if k != "out.bias"}),
        "rejected",
        "client 2 omitted parameters ['out.bias']",
    ),
    "a weight misshapen": (
        _weights(lambda w: {**w, "out.bias": torch.zeros(3)}),
        "rejected",
        "client 2 sent out.bias with shape (3,), expected (10,)",
    ),
    "an unknown weight": (
        _weights(lambda w: {**w, "extra": torch.zeros(1)}),
        "rejected",
        "client 2 sent unknown parameters ['extra']",
    ),
}


@pytest.mark.parametrize("case", list(SPOILED))
def test_a_reply_missing_or_malforming_a_required_field_is_refused_naming_it_and_the_round_goes_on(
    tmp_path, case, caplog
):
    spoil, kind, reason = SPOILED[case]
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        lines = run_with_own_apps(digits_config(), tmp_path, spoil)
    for m in lines:  # client 2 is refused every round, by field; clients 0 and 1 are aggregated
        assert m["clients"] == [0, 1] and reason in m[kind]["2"], m
    # the log names the client and its node, and the field
    said = (
        "client 2 (node 103) failed: " if kind == "failed" else "rejected the update of client 2 (node 103): "
    )
    assert f"round 2: {said}{reason}" in caplog.text


def test_content_to_reply_names_the_malformed_field():
    good = reply_to_content(Reply(weights={"w": torch.ones(2)}, num_examples=3, metrics={"train_loss": 0.5}))
    good["metrics"]["accuracy"] = [1.0, 2.0]
    with pytest.raises(ProtocolError, match="metric 'accuracy' is \\[1.0, 2.0\\]; metrics must be numbers"):
        content_to_reply(good)
    bare = RecordDict({"reply": ConfigRecord({"num_examples": 4})})
    assert content_to_reply(bare, description=True).num_examples == 4  # a description needs no weights
    with pytest.raises(ProtocolError, match="no 'weights' record"):
        content_to_reply(bare)
    bare["weights"] = ConfigRecord({"w": 1.0})
    with pytest.raises(ProtocolError, match="'weights' record is a ConfigRecord; it must be an ArrayRecord"):
        content_to_reply(bare)


def test_a_description_without_the_node_record_refuses_the_node_by_name(tmp_path, caplog):
    cfg = digits_config(rounds=1)

    def spoil_description(app_of_node_103: ClientApp) -> ClientApp:
        app = ClientApp()

        @app.query()
        def describe(message: Message, context) -> Message:
            return Message(RecordDict({"reply": ConfigRecord({"num_examples": 5})}), reply_to=message)

        @app.train()
        def train(message: Message, context) -> Message:
            return app_of_node_103(message, context)

        return app

    fed = build_federation(cfg, torch.device("cpu"))
    nodes = {
        101 + c.cid: (own_client_app(c.inputs[c.indices], c.labels[c.indices], c.cid, None), {})
        for c in fed.clients
    }
    nodes[103] = (spoil_description(nodes[103][0]), {})
    with server_identity(), caplog.at_level(logging.ERROR, logger="fedhet"):
        FlowerServer(
            cfg,
            build_strategy("fedavg", {}),
            LoopbackGrid(nodes),
            run_dir=tmp_path / "run",
            connect_timeout=0,
        ).run()
    refused = json.loads((tmp_path / "run" / "flower_nodes.json").read_text())["refused"]
    assert "node 103 answered the describe query without a 'fedhet.node' record" in refused["103"]
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["clients"] == [0, 1] and "no node holds this client" in line["failed"]["2"]


# -- what the ServerApp tells Flower's log ------------------------------------------------------------------
def test_the_round_line_names_accuracy_and_refused_clients_with_their_node():
    line = {"round": 2, "clients": [0, 1], "accuracy": 0.8125, "failed": {"2": "node 103: no weights\nmore"}}
    text = round_text(2, 3, line, lambda cid: f"client {cid} (node {101 + cid})")
    assert text == (
        "round 2/3: accuracy 81.25 %, 2 updates used (clients 0, 1); failed: client 2 (node 103): "
        "node 103: no weights"
    )


def test_a_flwr_run_server_app_logs_rounds_the_end_and_its_absolute_run_folder_to_flowers_log(
    tmp_path, caplog, monkeypatch
):
    cfg = digits_config()
    (tmp_path / "app").mkdir()
    from fedhet.config import to_toml

    (tmp_path / "app" / "x.toml").write_text(to_toml(cfg))
    fed = build_federation(cfg, torch.device("cpu"))
    nodes = {
        101 + c.cid: (own_client_app(c.inputs[c.indices], c.labels[c.indices], c.cid, None), {})
        for c in fed.clients
    }
    monkeypatch.chdir(tmp_path)  # where a SuperLink was started: a relative run-dir lands here
    from flwr.app import Context

    context = Context(
        run_id=1, node_id=1, node_config={}, state=RecordDict(),
        run_config={"config": "x.toml", "run-dir": "runs/rel", "connect-timeout": 0.0},
    )  # fmt: skip
    app = make_server_app(app_dir=tmp_path / "app")
    with server_identity(), caplog.at_level(logging.INFO, logger="flwr"):
        app(LoopbackGrid(nodes), context)
    flower = [r.getMessage() for r in caplog.records if r.name == "flwr"]
    assert any(m.startswith("fedhet: round 1/2: accuracy ") for m in flower), flower
    assert any(m.startswith("fedhet: round 2/2: accuracy ") for m in flower), flower
    assert any(m.startswith("fedhet: fedavg: 2 rounds done; final accuracy ") for m in flower), flower
    assert f"fedhet: run folder: {tmp_path / 'runs' / 'rel'}" in flower
    assert (tmp_path / "runs" / "rel" / "summary.json").is_file()
    # a failing run says so in Flower's log, with the folder, and still raises (Flower marks it failed)
    caplog.clear()
    refused = pytest.raises(RunDirectoryError, match="overwrite=true in flwr run's --run-config")
    with server_identity(), caplog.at_level(logging.INFO, logger="flwr"), refused:
        app(LoopbackGrid(nodes), context)  # the finished run folder is refused without overwrite
    errors = [r.getMessage() for r in caplog.records if r.name == "flwr" and r.levelno == logging.ERROR]
    assert (
        errors
        and errors[0].startswith("fedhet: the run failed: ")
        and str(tmp_path / "runs" / "rel") in errors[0]
    )


def test_fedhets_own_log_records_reach_flowers_log_only_where_nothing_else_shows_them(caplog):
    from fedhet.flower.server_log import fedhet_log_to_flower

    logger = logging.getLogger("fedhet")
    caplog.set_level(logging.DEBUG, logger="flwr")
    logger.propagate = False  # as in flwr-serverapp's process: no handler above fedhet's logger
    try:
        with fedhet_log_to_flower():
            logging.getLogger("fedhet.flower").info("round %d done", 1)
        logging.getLogger("fedhet.flower").warning("after the block")
    finally:
        logger.propagate = True
    flower = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "flwr"]
    assert flower == [(logging.INFO, "fedhet.flower: round 1 done")]
    caplog.clear()
    with fedhet_log_to_flower():  # pytest's handler shows fedhet's records: nothing is sent twice
        logging.getLogger("fedhet.flower").warning("shown once")
    assert [r.name for r in caplog.records] == ["fedhet.flower"]


# -- CELM's warm-up without replies ------------------------------------------------------------------------
def _fedhet_nodes(cfg, silent: Callable[[int, int], bool]) -> LoopbackGrid:
    """fedhet's own ClientApp on nodes 101..103 (client i on 101 + i, Flower simulation style), answering
    a train message with an error where ``silent(client, round)``: as a node that failed, no update."""
    from flwr.app import Error

    from fedhet.flower.client import make_client_app

    def node(cid: int) -> ClientApp:
        inner, app = make_client_app(), ClientApp()

        @app.query()
        def describe(message: Message, context) -> Message:
            return inner(message, context)

        @app.train()
        def train(message: Message, context) -> Message:
            if silent(cid, int(message.metadata.group_id)):
                return Message(Error(code=0, reason="no update this round"), reply_to=message)
            return inner(message, context)

        return app

    return LoopbackGrid({101 + c: (node(c), {"partition-id": c, "num-partitions": 3}) for c in range(3)})


@pytest.mark.parametrize("silent", ["none", "round 2, and client 2 throughout"])
def test_celm_warns_by_round_and_client_when_its_warm_up_got_no_replies(tmp_path, caplog, silent):
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", "iid", 3
    cfg.train.rounds, cfg.train.local_steps, cfg.train.threads = 3, 5, 1
    cfg.eval.fairness = False
    cfg.method.name, cfg.method.params = "celm", {"warmup_fraction": 0.5, "probe_steps": 5}  # T_w = ⌈1.5⌉ = 2
    if silent == "none":
        grid = _fedhet_nodes(cfg, lambda cid, rnd: False)
    else:  # every node fails round 2; client 2 fails both warm-up rounds, then trains in round 3
        grid = _fedhet_nodes(cfg, lambda cid, rnd: rnd == 2 or (cid == 2 and rnd <= 2))
    strategy = build_strategy("celm", cfg.method.params)
    with server_identity(), caplog.at_level(logging.WARNING, logger="fedhet"):
        FlowerServer(cfg, strategy, grid, run_dir=tmp_path / "run", connect_timeout=0).run()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CELM: ")]
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    if silent == "none":
        assert said == [] and all(m["clients"] == [0, 1, 2] for m in lines)
        return
    assert [m["clients"] for m in lines] == [[0, 1], [], [0, 1, 2]]
    assert said == [
        "CELM: warm-up round 2 got no replies, so the contribution weights (frozen from round 3) come from "
        "round 1 alone; client 2 replied in no warm-up round, so its weight is its starting share, not an "
        "estimate; see 'failed' and 'rejected' in metrics.jsonl for why"
    ]
    # what it says is so: client 2 kept c^0 = 1/3 (a client missing from a round keeps its weight)
    assert strategy.contributions()[2] == pytest.approx(1 / 3, abs=1e-12)
