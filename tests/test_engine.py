"""The embedded engine: FedAvg accuracy on real data, determinism, rejected/dropped clients, resume."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedhet.algorithms.fedavg import SGDTrainer, weighted_average
from fedhet.config import ExperimentConfig
from fedhet.engine.boundary import check_description, check_reply
from fedhet.engine.client import start_weights
from fedhet.engine.protocol import Instruction, Reply
from fedhet.engine.schedule import learning_rate, sample_clients
from fedhet.errors import ClientUpdateError, ConfigError, ProtocolError
from fedhet.experiment import make_simulation, standalone_accuracies


def small_config(**over) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset = "fashion-mnist"
    cfg.data.split = "iid"
    cfg.data.clients = 4
    cfg.data.max_train_samples = 4000
    cfg.data.max_test_samples = 2000
    cfg.train.rounds = 3
    cfg.train.batch_size = 64
    cfg.train.lr = 0.1
    cfg.eval.checkpoint_every = 1
    for k, v in over.items():
        section, key = k.split("__")
        setattr(getattr(cfg, section), key, v)
    return cfg


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


@pytest.mark.slow
def test_fedavg_fashion_mnist_iid_reaches_85_percent_in_10_rounds(tmp_path):
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "iid", 10
    cfg.model.name = "mlp"
    cfg.train.rounds, cfg.train.local_epochs = 10, 1
    cfg.eval.every = 5
    cfg.eval.fairness = False
    summary = make_simulation(cfg, run_dir=tmp_path / "run").run()
    assert summary["final"]["accuracy"] >= 0.85, summary["final"]
    assert summary["best"]["accuracy"] >= summary["final"]["accuracy"] - 1e-12


@pytest.mark.numerics
def test_same_seed_gives_identical_metrics_and_other_seed_differs(tmp_path):
    cfg = small_config()
    cfg.eval.fairness = False
    make_simulation(cfg, run_dir=tmp_path / "a").run()
    make_simulation(cfg, run_dir=tmp_path / "b").run()
    a = (tmp_path / "a" / "metrics.jsonl").read_text()
    assert a == (tmp_path / "b" / "metrics.jsonl").read_text()
    assert len(a.splitlines()) == cfg.train.rounds
    cfg2 = small_config()
    cfg2.seed = 1
    cfg2.eval.fairness = False
    make_simulation(cfg2, run_dir=tmp_path / "c").run()
    assert a != (tmp_path / "c" / "metrics.jsonl").read_text()


class CorruptTrainer(SGDTrainer):
    """Client 1 sends NaN weights; client 2 sends a wrongly shaped tensor."""

    def finish(self, u, metrics):
        reply = super().finish(u, metrics)
        if u.data.cid == 1:
            key = next(iter(reply.weights))
            reply.weights[key] = torch.full_like(reply.weights[key], float("nan"))
        if u.data.cid == 2:
            key = next(iter(reply.weights))
            reply.weights[key] = reply.weights[key][:1]
        return reply


def test_corrupt_updates_are_rejected_and_logged_while_the_round_goes_on(tmp_path, caplog):
    cfg = small_config()
    cfg.eval.fairness = False
    with caplog.at_level("WARNING", logger="fedhet"):
        summary = make_simulation(cfg, run_dir=tmp_path / "r", trainer=CorruptTrainer()).run()
    lines = [json.loads(s) for s in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        assert line["clients"] == [0, 3]
        assert set(line["rejected"]) == {"1", "2"}
        assert "non-finite" in line["rejected"]["1"] and "shape" in line["rejected"]["2"]
    assert "rejected the update of client 1" in caplog.text
    assert math.isfinite(summary["final"]["accuracy"]) and summary["final"]["accuracy"] > 0.5


def test_dropped_clients_do_not_break_a_round(tmp_path):
    cfg = small_config()
    cfg.train.client_dropout = 0.6
    cfg.train.rounds = 4
    cfg.eval.fairness = False
    make_simulation(cfg, run_dir=tmp_path / "r").run()
    lines = [json.loads(s) for s in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any(line.get("dropped") for line in lines)
    for line in lines:
        assert set(line["clients"]).isdisjoint(line.get("dropped", []))


def test_summary_last_view_is_the_mean_of_the_last_10_rounds_evaluations(tmp_path):
    cfg = small_config(train__rounds=13, train__local_steps=2, eval__every=2, eval__checkpoint_every=0)
    cfg.eval.fairness = False
    summary = make_simulation(cfg, run_dir=tmp_path / "r").run()
    lines = [json.loads(s) for s in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [line for line in lines if "accuracy" in line]
    assert [line["round"] for line in evaluated] == [2, 4, 6, 8, 10, 12, 13]  # every 2, and the last
    recent = [line["accuracy"] for line in evaluated if line["round"] > 3]  # rounds 4..13
    assert summary["last"]["accuracy"] == pytest.approx(sum(recent) / len(recent), abs=1e-12)
    assert summary["last"]["balanced_accuracy"] <= max(line["balanced_accuracy"] for line in evaluated)
    assert "per_class_recall" not in summary["last"]  # scalars only
    # the last 100 evaluations: all 7 here (a run evaluated fewer times averages every evaluation)
    every = [line["accuracy"] for line in evaluated]
    assert summary["last_100"]["accuracy"] == pytest.approx(sum(every) / len(every), abs=1e-12)


def test_summary_last_100_view_averages_only_the_last_100_evaluations():
    from types import SimpleNamespace

    from fedhet.engine.records import run_summary

    history = [{"round": r, "accuracy": float(r)} for r in range(1, 131)]  # accuracy r at round r
    federation = SimpleNamespace(sizes=[10, 10], info={})
    summary = run_summary(
        small_config(train__rounds=130),
        history,
        run_dir=None,
        federation=federation,
        contributions=None,
        standalone=None,
        wall=0.0,
        commit="c",
        code_commits=[],
    )
    assert summary["last_100"]["accuracy"] == pytest.approx((31 + 130) / 2)  # mean of 31..130
    assert summary["best"]["accuracy"] == 130.0 and summary["final"]["accuracy"] == 130.0


class Interrupt(Exception):
    pass


def interrupt_at(stop: int):
    """A progress callback that interrupts the run once round ``stop`` is written and checkpointed."""

    def callback(rnd, total, line):
        if rnd == stop:
            raise Interrupt

    return callback


def test_interrupted_run_resumes_from_its_last_checkpoint_with_identical_results(tmp_path):
    cfg = small_config()
    cfg.train.rounds = 4
    cfg.eval.fairness = False
    make_simulation(cfg, run_dir=tmp_path / "full").run()

    with pytest.raises(Interrupt):
        make_simulation(cfg, run_dir=tmp_path / "cut", progress=interrupt_at(3)).run()
    # round 3 was written to metrics.jsonl and checkpointed before the interrupt; drop them to mimic a crash
    import shutil

    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "round_00003")
    make_simulation(cfg, run_dir=tmp_path / "cut", resume=True).run()
    full = (tmp_path / "full" / "metrics.jsonl").read_text()
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == full


def test_standalone_accuracies_are_cached(tmp_path):
    cfg = small_config()
    cfg.train.rounds = 2
    first = standalone_accuracies(cfg)
    assert first.shape == (4,) and np.all((first > 0.3) & (first <= 1))
    cached = list((tmp_path / "cache" / "standalone").glob("*.json"))
    assert len(cached) == 1
    again = standalone_accuracies(cfg)
    np.testing.assert_array_equal(first, again)


def test_the_standalone_cache_keys_dropout_and_never_stores_a_client_that_did_not_train(tmp_path):
    from fedhet.experiment import standalone_key

    cfg = small_config()
    assert standalone_key(cfg) != standalone_key(
        cfg.copy(train__client_dropout=0.25)
    )  # it changes the result
    assert standalone_key(cfg) == standalone_key(cfg.copy(train__threads=2))
    # every update non-finite (lr = 1e9): no accuracy for anyone, nothing cached, a clear error later
    diverging = cfg.copy(train__lr=1e9, train__rounds=1)
    acc = standalone_accuracies(diverging)
    assert acc.shape == (4,) and np.all(np.isnan(acc))
    assert not list((tmp_path / "cache" / "standalone").glob("*.json"))
    cfg.train.rounds = 1
    good = standalone_accuracies(cfg)
    [cached] = (tmp_path / "cache" / "standalone").glob("*.json")
    cached.write_text('{"accuracies": [0.5, NaN, 0.5, 0.5]}')  # a poisoned entry (older fedhet) is recomputed
    np.testing.assert_array_equal(standalone_accuracies(cfg), good)
    assert "NaN" not in cached.read_text()


def test_fedavg_fairness_metrics_use_local_models(tmp_path):
    cfg = small_config()
    cfg.data.split = "cla"
    cfg.data.split_params = {"samples_per_client": 500}
    cfg.train.rounds = 2
    cfg.eval.fairness = True  # FedAvg measures fairness when asked ("auto" does not pay for the pre-pass)
    summary = make_simulation(cfg, run_dir=tmp_path / "r").run()
    assert summary["rewards"] is not None and len(summary["rewards"]) == 4
    assert summary["standalone"] is not None
    for key in ("fairness_pearson", "fairness_spearman", "bcf_rate", "bcf_rate_code"):
        assert key in summary["final"]


def test_learning_rate_schedules():
    cfg = ExperimentConfig()
    cfg.train.rounds, cfg.train.lr, cfg.train.lr_min = 10, 0.1, 0.0
    cfg.train.schedule = "cosine"
    assert learning_rate(cfg, 1) == pytest.approx(0.1)
    assert learning_rate(cfg, 6) == pytest.approx(0.05)
    cfg.train.schedule = "exponential"
    cfg.train.lr_decay = 0.5
    assert learning_rate(cfg, 3) == pytest.approx(0.025)


def test_client_sampling_counts_and_fractions():
    cfg = ExperimentConfig()
    cfg.data.clients = 20
    cfg.train.clients_per_round = 8
    a = sample_clients(cfg, 1)
    assert len(a) == 8 and a == sorted(a) and len(set(a)) == 8
    assert a == sample_clients(cfg, 1) and a != sample_clients(cfg, 2)
    cfg.train.clients_per_round = 0.25
    assert len(sample_clients(cfg, 1)) == 5
    cfg.train.clients_per_round = 1.0
    assert sample_clients(cfg, 1) == list(range(20))


def test_weighted_average_known_answer():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    out = weighted_average([a, b], [1, 3])
    torch.testing.assert_close(out["w"], torch.tensor([2.5, 5.0]))
    assert int(out["n"]) == 3


def test_check_reply_messages():
    ref = {"w": torch.zeros(2, 2)}
    check_reply(0, Reply(weights={"w": torch.ones(2, 2)}, num_examples=3), ref)
    with pytest.raises(ClientUpdateError, match="unknown parameters"):
        check_reply(0, Reply(weights={"w": torch.ones(2, 2), "x": torch.ones(1)}, num_examples=3), ref)
    with pytest.raises(ClientUpdateError, match="omitted"):
        check_reply(0, Reply(weights={}, num_examples=3), ref)
    with pytest.raises(ClientUpdateError, match="num_examples"):
        check_reply(0, Reply(weights={"w": torch.ones(2, 2)}, num_examples=-1), ref)
    # finite entries whose sum overflows float32 are accepted; one inf, -inf or NaN entry is refused
    huge = torch.full((2, 2), 3e38)
    assert not torch.isfinite(huge.sum())
    check_reply(0, Reply(weights={"w": huge}, num_examples=3), ref)
    for bad in (float("inf"), float("-inf"), float("nan")):
        for start in (torch.ones(2, 2), huge.clone(), torch.tensor([[3e38, -3e38], [1.0, 1.0]])):
            start[1, 1] = bad
            with pytest.raises(ClientUpdateError, match="non-finite values"):
                check_reply(0, Reply(weights={"w": start}, num_examples=3), ref)
    check_reply(0, Reply(weights={"w": torch.tensor([[1, 2], [3, 4]])}, num_examples=3), ref)  # integers


def test_check_description_messages():
    good = Reply(weights={}, num_examples=4, payload={"class_counts": torch.tensor([1, 0, 3])})
    check_description(0, good, 3)
    with pytest.raises(ClientUpdateError, match="shape"):
        check_description(2, Reply(weights={}, num_examples=4, payload={"class_counts": torch.ones(2)}), 3)
    with pytest.raises(ClientUpdateError, match="negative"):
        check_description(
            2, Reply(weights={}, num_examples=4, payload={"class_counts": torch.tensor([1, -1, 0])}), 3
        )
    with pytest.raises(ClientUpdateError, match="num_examples"):
        check_description(2, Reply(weights={}, num_examples=2.5, payload=good.payload), 3)


def test_start_weights_overlay_delta_and_protocol_errors():
    keys = ("a", "b")
    kept = {"a": torch.ones(2), "b": torch.ones(2)}
    # the instruction's weights win over what the client kept; the rest comes from what it kept
    out = start_weights(Instruction(weights={"a": torch.full((2,), 5.0)}), kept, keys)
    torch.testing.assert_close(out["a"], torch.full((2,), 5.0))
    torch.testing.assert_close(out["b"], torch.ones(2))
    out = start_weights(Instruction(weights={"a": torch.full((2,), 2.0)}, delta=True), kept, keys)
    torch.testing.assert_close(out["a"], torch.full((2,), 3.0))
    torch.testing.assert_close(out["b"], torch.ones(2))
    # a client that keeps nothing needs the full model, and cannot add a delta
    with pytest.raises(ProtocolError, match="lacks 1 of the model's 2"):
        start_weights(Instruction(weights={"a": torch.zeros(2)}), None, keys)
    with pytest.raises(ProtocolError, match="delta"):
        start_weights(Instruction(weights={"a": torch.zeros(2)}, delta=True), None, keys)
    full = {"a": torch.zeros(2), "b": torch.zeros(2)}
    assert start_weights(Instruction(weights=full), kept, keys) is full


def test_the_best_participants_reward_accuracy_is_the_maximum_of_the_rewards(tmp_path):
    cfg = small_config(train__rounds=2)
    cfg.eval.fairness = False
    make_simulation(cfg, run_dir=tmp_path / "r").run()
    for line in map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()):
        assert line["best_reward_accuracy"] == max(line["rewards"])  # FedAvg's local-model rewards


def test_a_run_can_start_from_another_runs_final_global_model(tmp_path):
    cfg = small_config(train__rounds=2)
    cfg.eval.fairness = False
    first = make_simulation(cfg, run_dir=tmp_path / "a-seed0")
    first.run()
    final = {k: v.clone() for k, v in first.strategy.model.state_dict().items()}
    warm = small_config(train__rounds=1)
    warm.eval.fairness = False
    warm.model.init_from = str(tmp_path / "a-seed{seed}")  # one warm start per seed
    sim = make_simulation(warm)
    sim.setup()
    assert all(torch.equal(sim.info.model.state_dict()[k], v) for k, v in final.items())
    warm.model.init_from = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        make_simulation(warm).setup()
    warm.model.init_from = str(tmp_path / "a-seed0")
    warm.model.params = {"hidden_sizes": [16]}
    with pytest.raises(ConfigError, match="same model"):
        make_simulation(warm).setup()


def test_a_warm_started_run_is_reused_or_resumed_only_while_its_warm_start_is_unchanged(tmp_path):
    from fedhet.comparison import conflicting_cells, finished_summary, resumable

    def source(lr: float) -> None:
        cfg = small_config(train__rounds=1, train__lr=lr)
        cfg.eval.fairness = False
        make_simulation(cfg, run_dir=tmp_path / "a", overwrite=True).run()

    source(0.05)
    warm = small_config(train__rounds=2)
    warm.eval.fairness, warm.eval.checkpoint_every = False, 1
    warm.model.init_from = str(tmp_path / "a")
    make_simulation(warm, run_dir=tmp_path / "b").run()
    assert json.loads((tmp_path / "b" / "warm_start.json").read_text())["init_from"] == str(tmp_path / "a")
    assert finished_summary(warm, tmp_path / "b") is not None
    source(0.05)  # the same source run again: the same weights, still reused
    assert finished_summary(warm, tmp_path / "b") is not None
    source(0.07)  # another source model at the same path: b is no longer this experiment's result
    assert finished_summary(warm, tmp_path / "b") is None
    cell = SimpleNamespace(run_dir=tmp_path / "b", cfg=warm)  # the two fields of a planned cell it reads
    assert conflicting_cells([cell]) == [f"{tmp_path / 'b'} (finished, another configuration)"]
    (tmp_path / "b" / "summary.json").unlink()  # unfinished, with checkpoints: resuming it is refused too
    assert not resumable(warm, tmp_path / "b")
    with pytest.raises(ConfigError, match="started from other weights"):
        make_simulation(warm, run_dir=tmp_path / "b", resume=True).run()


def test_a_client_whose_training_raises_is_a_failed_client_and_the_run_goes_on(tmp_path):
    """Client 1's trainer raises in round 2: that round is recorded without it ('failed', with the error),
    the others are aggregated, and client 1 trains again in round 3."""

    class Flaky(SGDTrainer):
        def fit(self, u):
            if u.context.round == 2 and u.data.cid == 1:
                raise RuntimeError("CUDA out of memory (simulated)")
            return super().fit(u)

    from fedhet.algorithms import build_strategy
    from fedhet.engine.simulation import Simulation

    cfg = small_config()
    cfg.eval.fairness = False
    sim = Simulation(cfg, build_strategy("fedavg", {}), run_dir=tmp_path / "r", trainer=Flaky())
    sim.run()
    lines = [json.loads(s) for s in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert lines[1]["clients"] == [0, 2, 3]
    assert lines[1]["failed"] == {"1": "training raised RuntimeError: CUDA out of memory (simulated)"}
    assert lines[2]["clients"] == [0, 1, 2, 3] and "failed" not in lines[2]
    # a ConfigError inside a client is the run's error, not the client's
    cfg.train.local_epochs = 1e-4
    with pytest.raises(ConfigError, match="0 local steps"):
        Simulation(cfg, build_strategy("fedavg", {}), trainer=SGDTrainer()).run()


def test_resume_survives_a_corrupt_newest_checkpoint_and_a_torn_metrics_line(tmp_path, caplog):
    """Killed after round 3: the round-3 checkpoint's tensors are damaged (a flipped byte, caught by the
    checksum) and metrics.jsonl ends in half a line. Resume falls back to round 2, with a warning for each,
    and the finished run is identical to an uninterrupted one."""
    import logging

    cfg = small_config()
    cfg.train.rounds = 4
    cfg.eval.fairness = False
    make_simulation(cfg, run_dir=tmp_path / "full").run()

    def stop_at_3(rnd, total, line):
        if rnd == 3:
            raise Interrupt

    cut = tmp_path / "cut"
    with pytest.raises(Interrupt):
        make_simulation(cfg, run_dir=cut, progress=stop_at_3).run()
    tensors = cut / "checkpoints" / "round_00003" / "tensors.safetensors"
    blob = bytearray(tensors.read_bytes())
    blob[-3] ^= 0xFF  # inside the last tensor's data: still a well-formed file, wrong numbers
    tensors.write_bytes(bytes(blob))
    metrics = cut / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"round": 4, "lr": 0.1, "clie')  # a write cut short
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        make_simulation(cfg, run_dir=cut, resume=True).run()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "round_00003/tensors.safetensors does not match its checksum" in messages
    assert "trying the previous checkpoint" in messages and "is torn (not JSON)" in messages
    assert metrics.read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


def test_resume_with_flags_that_change_the_experiment_is_refused(tmp_path, capsys):
    from fedhet.cli import main

    out = tmp_path / "r"
    base = ["run", "--method", "fedavg", "--dataset", "digits", "--clients", "2", "--rounds", "1", "--quiet"]
    assert main([*base, "--set", "eval.fairness=false", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--rounds", "3", "--set", "train.lr=0.5", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (
        f"--resume {out} continues the run exactly as its config.toml says; --rounds, --set train.lr=0.5"
        in err
    )
    assert main(["run", "--resume", str(out), "--quiet"]) == 0  # alone it is fine


def test_free_rider_view_of_the_summary():
    from fedhet.engine.records import free_rider_view

    # hand-computed: client 0 holds 0.05 of the weight, strictly lowest; 0.05 x 5 clients = 0.25
    out = free_rider_view(np.array([0.05, 0.3, 0.25, 0.2, 0.2]), 0)
    assert out == {"free_rider_lowest": 1.0, "free_rider_weight_ratio": pytest.approx(0.25)}
    tied = free_rider_view(np.array([1.0, 1.0, 8.0]), 1)  # normalised 0.1: tied with client 0, not lowest
    assert tied == {"free_rider_lowest": 0.0, "free_rider_weight_ratio": pytest.approx(0.3)}
    assert free_rider_view(np.array([-0.1, 0.6, 0.5]), 0) == {}  # signed scores: no weight share
    assert free_rider_view(None, 0) == {} and free_rider_view(np.array([0.2, 0.8]), None) == {}


def test_a_free_rider_run_reports_whether_the_free_rider_was_lowest(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", "free-rider", 4
    cfg.data.split_params = {"alpha": 1.0, "free_rider": 2, "actual_size": 5}
    cfg.train.rounds, cfg.eval.fairness = 2, False
    cfg.method.name, cfg.method.params = "celm", {"warmup_fraction": 0.5, "probe_steps": 5}
    sim = make_simulation(cfg, run_dir=tmp_path / "run")
    sim.run()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    w = np.asarray(summary["contributions"]) / np.sum(summary["contributions"])
    assert summary["final"]["free_rider_weight_ratio"] == pytest.approx(w[2] * 4)
    assert summary["final"]["free_rider_lowest"] == float(all(w[2] < np.delete(w, 2)))


def test_a_rollback_snapshot_is_an_independent_copy_like_deepcopy_keeping_shared_tensors_shared():
    import copy

    from fedhet.engine.weights import snapshot_state

    model = torch.nn.Linear(3, 2)
    shared = torch.arange(4.0)
    state = {
        "model": model.state_dict(),  # views of the live parameters
        "clients": {"0": {"w": torch.ones(2)}, "1": [shared, (shared, 7)]},
        "numbers": np.array([1.0, 2.0]),
        "round": 3,
    }
    snap, reference = snapshot_state(state), copy.deepcopy(state)
    with torch.no_grad():  # the round goes on: everything the strategy holds changes in place
        model.weight.add_(1.0)
        state["clients"]["0"]["w"].mul_(5.0)
        shared.fill_(-1.0)
    state["numbers"][0] = 9.0
    for path in (("model", "weight"), ("model", "bias"), ("clients", "0", "w")):
        a, b = snap, reference
        for key in path:
            a, b = a[key], b[key]
        assert torch.equal(a, b) and not a.requires_grad
    listed = snap["clients"]["1"]
    assert type(listed) is list and type(listed[1]) is tuple and listed[1][1] == 7
    assert torch.equal(listed[0], torch.arange(4.0)) and listed[1][0] is listed[0]  # held twice, one copy
    assert snap["numbers"].tolist() == [1.0, 2.0] and snap["round"] == 3


def test_a_run_names_the_commit_each_stretch_of_its_rounds_ran_at_read_as_the_rounds_start(
    tmp_path, monkeypatch
):
    """A result page cites the code its numbers came from: the commit is read when a process starts its
    rounds (the code it imported), not when the summary is written, and a run resumed under other code lists
    both stretches. Each stretch names the results stamp it computed under (the method's, here FedAvg's)."""
    import fedhet.engine.rounds as rounds
    from fedhet.reproduce import cell_provenance
    from fedhet.reproduce.store import method_stamp

    stamp = method_stamp("fedavg")

    cfg = small_config()
    cfg.train.rounds, cfg.eval.fairness = 4, False
    current = {"commit": "aaa1111"}
    monkeypatch.setattr(rounds, "commit", lambda: current["commit"])
    new_process = rounds.process_commit.cache_clear  # each run below stands for a process of its own
    new_process()

    def edit_then_stop_at_3(rnd, total, line):
        current["commit"] = "edited (with uncommitted changes)"  # the tree changes while the rounds run
        if rnd == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        make_simulation(cfg, run_dir=tmp_path / "run", progress=edit_then_stop_at_3).run()
    import shutil

    shutil.rmtree(tmp_path / "run" / "checkpoints" / "round_00003")  # resume from round 2's checkpoint
    current["commit"] = "bbb2222"
    new_process()
    summary = make_simulation(cfg, run_dir=tmp_path / "run", resume=True).run()
    assert summary["fedhet_commits"] == [
        {"commit": "aaa1111", "results": stamp, "from_round": 1},
        {"commit": "bbb2222", "results": stamp, "from_round": 3},
    ]
    assert summary["fedhet_commit"] == "bbb2222"
    # a run that starts and ends under one commit names it once, whatever the tree holds at its end
    current["commit"] = "ccc3333"
    new_process()
    cfg.train.rounds = 2
    edited = lambda rnd, total, line: current.update(commit="later")  # noqa: E731
    one = make_simulation(cfg, run_dir=tmp_path / "one", progress=edited).run()
    assert one["fedhet_commits"] == [{"commit": "ccc3333", "results": stamp, "from_round": 1}]
    assert one["fedhet_commit"] == "ccc3333"
    # resumed under the commit it stopped at: still one stretch
    current["commit"] = "ddd4444"
    new_process()
    with pytest.raises(Interrupt):
        make_simulation(cfg, run_dir=tmp_path / "same", progress=interrupt_at(2)).run()
    shutil.rmtree(tmp_path / "same" / "checkpoints" / "round_00002")
    new_process()
    same = make_simulation(cfg, run_dir=tmp_path / "same", resume=True).run()
    assert same["fedhet_commits"] == [{"commit": "ddd4444", "results": stamp, "from_round": 1}]
    # one process, several runs (a compare worker): the commit it read at its first run, for all of them
    current["commit"] = "eee5555"
    later = make_simulation(cfg, run_dir=tmp_path / "later").run()
    assert later["fedhet_commits"] == [{"commit": "ddd4444", "results": stamp, "from_round": 1}]
    new_process()
    result = {"available": True, "run_dir": str(tmp_path), "methods": {"fedavg": {}}, "seeds": [0]}
    (tmp_path / "fedavg-seed0").mkdir()
    for path in (tmp_path / "run", tmp_path / "one"):
        (tmp_path / "fedavg-seed0" / "summary.json").write_text((path / "summary.json").read_text())
        assert cell_provenance([result])["commits"] == sorted(
            c["commit"] for c in json.loads((path / "summary.json").read_text())["fedhet_commits"]
        )


def test_a_run_resumed_under_another_results_stamp_has_no_single_stamp(tmp_path, monkeypatch):
    """A run whose rounds ran under two stamps (a module's version bumped in between) lists both stretches,
    and the record store gives it no stamp: no record of it is ever reused."""
    import shutil

    import fedhet.algorithms.fedavg as fedavg_module
    from fedhet.reproduce.store import run_stamp

    cfg = small_config()
    cfg.train.rounds, cfg.eval.fairness = 3, False
    with pytest.raises(Interrupt):
        make_simulation(cfg, run_dir=tmp_path / "run", progress=interrupt_at(2)).run()
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "round_00002")
    monkeypatch.setattr(fedavg_module, "RESULTS_VERSION", fedavg_module.RESULTS_VERSION + 1)
    summary = make_simulation(cfg, run_dir=tmp_path / "run", resume=True).run()
    stamps = [stretch["results"] for stretch in summary["fedhet_commits"]]
    assert len(stamps) == 2 and "fedavg=1" in stamps[0] and "fedavg=2" in stamps[1]
    assert run_stamp(summary) is None


# -- the evaluation schedule (eval.every, eval.every_round_last) ---------------------------------------------
def test_the_evaluation_rounds_are_every_kth_the_last_n_and_the_last():
    from fedhet.engine.schedule import evaluates

    cfg = ExperimentConfig()
    cfg.train.rounds, cfg.eval.every, cfg.eval.every_round_last = 30, 10, 5
    assert [r for r in range(1, 31) if evaluates(cfg, r)] == [10, 20, 26, 27, 28, 29, 30]  # by hand
    cfg.eval.every, cfg.eval.every_round_last = 7, 0
    assert [r for r in range(1, 31) if evaluates(cfg, r)] == [7, 14, 21, 28, 30]


@pytest.mark.parametrize("method", ["fedavg", "fedrac"])
def test_evaluating_fewer_rounds_changes_no_training_and_no_evaluation(tmp_path, monkeypatch, method):
    """Every round evaluated against every 3rd plus the last 2: training lines identical in every round and
    the evaluated rounds' lines identical in full (FedRAC: rewards and fairness too), so a long run's final
    value and the mean of its last evaluations can be had without evaluating every round."""
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))

    def run(every: int, last: int, name: str) -> list[dict]:
        cfg = ExperimentConfig()
        cfg.data.dataset, cfg.data.clients, cfg.data.validation_fraction = "digits", 3, 0.1
        cfg.model.name, cfg.model.params = "mlp200", {"hidden_size": 16}
        cfg.train.rounds, cfg.train.local_steps, cfg.train.threads = 8, 2, 1
        cfg.method.name = method
        if method == "fedrac":
            cfg.method.params = {"candidate_step": 4, "candidate_step_late": 4}
        cfg.eval.every, cfg.eval.every_round_last = every, last
        make_simulation(cfg, run_dir=tmp_path / name).run()
        return [json.loads(s) for s in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    dense, sparse = run(1, 0, "dense"), run(3, 2, "sparse")
    evaluated = [line["round"] for line in sparse if "accuracy" in line]
    assert evaluated == [3, 6, 7, 8]
    for full, few in zip(dense, sparse, strict=True):
        if few["round"] in evaluated:
            assert few == full
        else:
            assert "accuracy" not in few and few == {k: v for k, v in full.items() if k in few}
            assert few["update_norms"] == full["update_norms"] and few["train_loss"] == full["train_loss"]
    if method == "fedrac":
        assert "fairness_pearson" in sparse[-1]  # rewards and fairness were evaluated


def test_a_reply_without_a_train_loss_is_accepted_and_the_round_mean_skips_it(tmp_path):
    """A user's own client may report no train_loss (the server crashed with a bare KeyError): the round goes
    on, and its train_loss is the mean over the replies that name one (here none: no train_loss at all)."""
    from fedhet.algorithms.fedavg import FedAvg

    class Silent(SGDTrainer):
        def finish(self, u, metrics):
            reply = super().finish(u, metrics)
            reply.metrics.pop("train_loss")
            return reply

    class SilentFedAvg(FedAvg):
        name = "silent"
        trainer_class = Silent

    cfg = small_config(train__rounds=1)
    summary = make_simulation(cfg, run_dir=tmp_path / "run", strategy=SilentFedAvg()).run()
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["clients"] == [0, 1, 2, 3] and "train_loss" not in line and summary["final"]["accuracy"] > 0.3
