"""A fedhet ServerApp whose run fails says only that in Flower's log (fedhet.flower.server_log.failure_lines):
the round it failed in, the error, the run folder and how to continue it — never "N rounds done" — and raises
on, so that Flower marks the run failed. fedhet's real ClientApps answer through the in-process loopback Grid
(tests/flower_loopback.py): no Ray, no network. The expected lines are written out by hand."""

from __future__ import annotations

import logging
from uuid import uuid4

import pytest

pytest.importorskip("flwr", reason="the Flower tests need fedhet[flower]; make setup installs it")

from flwr.app import Context, RecordDict  # noqa: E402
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message  # noqa: E402

from fedhet.errors import CALLER, TrainingDivergedError  # noqa: E402
from fedhet.flower.client import make_client_app  # noqa: E402
from fedhet.flower.server import make_server_app  # noqa: E402
from fedhet.flower.server_log import failure_lines  # noqa: E402
from flower_loopback import LoopbackGrid, server_identity  # noqa: E402
from support import digits_config, lines_of  # noqa: E402


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def nodes() -> LoopbackGrid:
    app = make_client_app()
    return LoopbackGrid({101 + i: (app, {"partition-id": i, "num-partitions": 3}) for i in range(3)})


class LinkGone(LoopbackGrid):
    """The SuperLink goes away while round ``gone`` is sent: Flower's Grid raises in the ServerApp."""

    def __init__(self, gone: int) -> None:
        self.__dict__.update(nodes().__dict__)
        self.gone = gone

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any(m.metadata.group_id == str(self.gone) for m in messages):
            raise ConnectionError("the SuperLink went away")
        return super().send_and_receive(messages)


class AllOffline(LoopbackGrid):
    """Every node describes itself, then Flower answers each training message for it as offline."""

    def __init__(self) -> None:
        self.__dict__.update(nodes().__dict__)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if all(m.metadata.group_id == "0" for m in messages):
            return super().send_and_receive(messages)
        for m in messages:
            m.metadata.__dict__["_message_id"] = str(uuid4())  # what the SuperLink sets on arrival
        return [create_message_error_unavailable_res_message(m.metadata, "node_unavail") for m in messages]


def flower_log_of(app, grid, run_dir, caplog, **run_config) -> list[tuple[int, str]]:
    """Run ``app`` as flwr run would (run-dir in the run config) and return what reached Flower's log."""
    context = Context(
        run_id=1, node_id=1, node_config={}, state=RecordDict(),
        run_config={"run-dir": str(run_dir), "connect-timeout": 0.0, **run_config},
    )  # fmt: skip
    caplog.clear()
    with server_identity(), caplog.at_level(logging.INFO, logger="flwr"):
        try:
            app(grid, context)
        finally:
            records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "flwr"]
    return records


def test_a_run_that_fails_in_a_round_says_where_and_how_to_resume_and_resuming_finishes_it(tmp_path, caplog):
    run = tmp_path / "run"
    app = make_server_app(digits_config(clients=3, rounds=3), log_to_flower=True)
    with pytest.raises(ConnectionError):
        flower_log_of(app, LinkGone(gone=2), run, caplog)
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "flwr"]
    texts = [m for _, m in logged]
    assert any(m.startswith("fedhet: round 1/3: accuracy ") for m in texts), texts
    assert not any("rounds done" in m or m.startswith("fedhet: round 2/3") for m in texts), texts
    # round 1 was finished (and saved by the stop: checkpoints fall every 10 rounds); round 2 never came back
    assert [(level, m) for level, m in logged if level == logging.ERROR] == [
        (logging.ERROR, "fedhet: the run failed in round 2 of 3: ConnectionError: the SuperLink went away"),
        (
            logging.ERROR,
            f"fedhet: run folder: {run}; its last saved round is 1: resume=true in flwr run's --run-config "
            "continues the run after it",
        ),
    ]
    assert [m["round"] for m in lines_of(run)] == [1]
    # the advice holds: resume=true on fresh nodes finishes the run
    texts = [m for _, m in flower_log_of(app, nodes(), run, caplog, resume=True)]
    assert [m["round"] for m in lines_of(run)] == [1, 2, 3]
    assert any(m.startswith("fedhet: fedavg: 3 rounds done; final accuracy ") for m in texts), texts


def test_a_run_that_diverges_says_it_failed_not_that_its_rounds_are_done(tmp_path, caplog):
    run = tmp_path / "run"
    app = make_server_app(digits_config(clients=3, rounds=2), log_to_flower=True)
    with pytest.raises(TrainingDivergedError):
        flower_log_of(app, AllOffline(), run, caplog)
    texts = [m for _, m in ((r.levelno, r.getMessage()) for r in caplog.records if r.name == "flwr")]
    assert not any("rounds done" in m or "contributions" in m for m in texts), texts
    errors = [r.getMessage() for r in caplog.records if r.name == "flwr" and r.levelno == logging.ERROR]
    assert len(errors) == 2, errors
    assert errors[0].startswith(
        "fedhet: the run failed in round 2 of 2: TrainingDivergedError: every client of rounds 1..2 failed; "
        "nothing is being trained. client 0 (node 101) failed: node 101 went offline"
    ), errors
    assert errors[1] == (
        f"fedhet: run folder: {run}; its summary.json records the run as diverged in round 2, a result that "
        "resume=true in flwr run's --run-config does not continue; overwrite=true in flwr run's --run-config "
        "runs it again"
    )
    assert (run / "summary.json").is_file()


def test_failure_lines_before_the_first_round_after_the_last_and_with_nothing_saved(tmp_path):
    token = CALLER.set("flower")
    try:
        # before round 1 (a config, a run folder, the nodes): the error alone, which names its fix
        assert failure_lines(ValueError("bad"), run_dir=tmp_path, rounds=5, failed_in=None, done=0) == [
            "the run failed: ValueError: bad"
        ]
        assert failure_lines(OSError("x")) == ["the run failed: OSError: x"]
        # after every round (a listener writing figures, say): the folder holds the rounds and a checkpoint
        assert failure_lines(OSError("disk full"), run_dir=tmp_path, rounds=5, done=5, saved=5) == [
            "the run failed after its last round (5): OSError: disk full",
            f"run folder: {tmp_path}; its last saved round is 5: resume=true in flwr run's --run-config "
            "continues the run after it",
        ]
        # in round 1 with nothing saved; a stop (flwr stop's KeyboardInterrupt) is not called a failure
        assert failure_lines(KeyboardInterrupt("stop"), run_dir=tmp_path, rounds=5, failed_in=1) == [
            "the run was stopped in round 1 of 5: KeyboardInterrupt: stop",
            f"run folder: {tmp_path}; no round was saved: "
            "resume=true in flwr run's --run-config runs it again from round 1",
        ]
    finally:
        CALLER.reset(token)
