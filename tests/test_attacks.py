"""The attack suite of [faults]: label-flip, free-rider, replay (client-side) and the coordinated adversary's
alie, ipm and adaptive-scale (a step of the round loop), with faults.every. Each expected value is computed
independently here (numpy, scipy) from the definitions in docs/reliability.md and the papers cited in
fedhet.engine.faults."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

import fedhet.engine.rounds as rounds_module
from fedhet.algorithms.fedavg import SGDTrainer
from fedhet.attacks import build_attack
from fedhet.config import ExperimentConfig, FaultsConfig, TrainConfig, apply_override
from fedhet.engine.client import run_client
from fedhet.engine.faults import (
    FAULT_MEMORY,
    Fault,
    alie_z,
    apply_fault,
    coordinated_attack,
    fault_data,
    fault_for,
)
from fedhet.engine.guards import clip_updates, guard_updates, update_norms
from fedhet.engine.protocol import LR_KEY, ClientData, ClientState, Instruction, Reply, TrainContext
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from fedhet.models import build_model
from support import digits_config, lines_of


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def fault(behaviour: str, factor: float = 100.0, noise_std: float = 1.0, seed: int = 3) -> Fault:
    attack = build_attack(behaviour, FaultsConfig(factor=factor, noise_std=noise_std))
    return Fault(attack, torch.Generator().manual_seed(seed))


# -- a round of synthetic replies: every client was sent W0 --------------------------------------------------
def synthetic_round(n: int, seed: int = 0, spread=None):
    """``n`` replies W0 + Δ_i (float32; an integer buffer too), all sent W0."""
    gen = torch.Generator().manual_seed(seed)
    w0 = {"a": torch.randn(3, 4, generator=gen), "b": torch.randn(5, generator=gen), "n": torch.tensor(7)}
    replies = {}
    for cid in range(n):
        scale = 1.0 if spread is None else spread[cid]
        delta = {k: scale * 0.1 * torch.randn(v.shape, generator=gen) for k, v in w0.items() if k != "n"}
        weights = {k: w0[k] + delta[k] for k in delta} | {"n": torch.tensor(9)}
        replies[cid] = Reply(weights=weights, num_examples=10 + cid)
    sent = {cid: Instruction(weights=dict(w0)) for cid in range(n)}
    return w0, replies, sent


def numpy_deltas(replies, w0, ids, key) -> np.ndarray:
    return np.stack([replies[c].weights[key].numpy().astype(np.float64) - w0[key].numpy() for c in ids])


# -- ALIE ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "f"), [(5, 1), (5, 2), (10, 2), (20, 4), (50, 12), (3, 1), (100, 20)])
def test_alie_z_max_is_the_papers_formula(n, f):
    s = math.floor(n / 2 + 1) - f  # Baruch et al. 2019, Sec. 3
    assert alie_z(n, f) == pytest.approx(norm.ppf((n - s) / n), rel=1e-12, abs=1e-12)


def test_alie_z_with_a_colluding_majority_or_a_lone_client_stays_finite():
    assert alie_z(4, 3) == pytest.approx(norm.ppf(3 / 4))  # s would be 0: s = 1
    assert alie_z(1, 1) == 0.0


@pytest.mark.parametrize("z", [None, 1.5])
def test_alie_colluders_send_mean_minus_z_std_of_the_honest_updates(z):
    w0, replies, sent = synthetic_round(6)
    cfg = digits_config(clients=6, faults__clients={"1": "alie", "4": "alie"})
    cfg.faults.z = z
    out = coordinated_attack(cfg, 1, replies, sent)
    honest = [0, 2, 3, 5]
    expected_z = norm.ppf((6 - (math.floor(6 / 2 + 1) - 2)) / 6) if z is None else z
    for key in ("a", "b"):
        d = numpy_deltas(replies, w0, honest, key)
        expected = d.mean(axis=0) - expected_z * d.std(axis=0)  # population std
        for c in (1, 4):
            got = out[c].weights[key].numpy().astype(np.float64) - w0[key].numpy()
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert torch.equal(out[1].weights["a"], out[4].weights["a"])  # colluders send the same vector
    assert out[1].weights["n"].item() == 9 and out[1].num_examples == 11  # buffers and counts as trained
    for c in honest:
        assert out[c] is replies[c]


def test_the_coordinated_step_runs_in_the_round_loop_on_the_honest_replies_it_gathered(tmp_path, monkeypatch):
    """A real run: what the adversary step receives and returns, captured; the colluder's reply is
    mean − z·std of the other clients' replies as gathered (numpy), and that is what the guards measured."""
    seen = []

    def spy(cfg, rnd, replies, sent, updates=False, global_norm=None):
        out = coordinated_attack(cfg, rnd, replies, sent, updates, global_norm)
        # the instructions share the global model's tensors, which the aggregation then changes: copy them
        copied = {c: {k: v.clone() for k, v in ins.weights.items()} for c, ins in sent.items()}
        seen.append((rnd, dict(replies), copied, out))
        return out

    monkeypatch.setattr(rounds_module, "coordinated_attack", spy)
    cfg = digits_config(clients=5, rounds=2, faults__clients={"0": "alie"})
    make_simulation(cfg, run_dir=tmp_path / "run").run()
    lines = lines_of(tmp_path / "run")
    assert [s[0] for s in seen] == [1, 2]
    z = norm.ppf((5 - (math.floor(5 / 2 + 1) - 1)) / 5)
    for (_, replies, sent, out), line in zip(seen, lines, strict=True):
        w0 = sent[0]
        for key, value in out[0].weights.items():
            if not value.is_floating_point():
                continue
            d = np.stack(
                [
                    replies[c].weights[key].numpy().astype(np.float64) - sent[c][key].numpy()
                    for c in (1, 2, 3, 4)
                ]
            )
            got = value.numpy().astype(np.float64) - w0[key].numpy()
            np.testing.assert_allclose(got, d.mean(axis=0) - z * d.std(axis=0), rtol=0, atol=1e-6)
        sent_norm = math.sqrt(
            sum(
                float(((v.double() - w0[k].double()) ** 2).sum())
                for k, v in out[0].weights.items()
                if v.is_floating_point()
            )
        )
        assert line["update_norms"]["0"] == pytest.approx(sent_norm, rel=1e-9)
        assert line["clients"] == [0, 1, 2, 3, 4]  # ALIE hides within the honest spread: the guard lets it in


# -- IPM -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("epsilon", [0.5, 100.0])
def test_ipm_colluders_send_minus_epsilon_times_the_mean_honest_update(epsilon):
    w0, replies, sent = synthetic_round(5, seed=1)
    cfg = digits_config(clients=5, faults__clients={"3": "ipm"}, faults__epsilon=epsilon)
    out = coordinated_attack(cfg, 1, replies, sent)
    for key in ("a", "b"):
        expected = -epsilon * numpy_deltas(replies, w0, [0, 1, 2, 4], key).mean(axis=0)
        got = out[3].weights[key].numpy().astype(np.float64) - w0[key].numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_ipm_on_a_trainer_that_uploads_updates_sends_the_update_itself():
    _, replies, _ = synthetic_round(4, seed=2)
    cfg = digits_config(clients=4, faults__clients={"0": "ipm"})
    out = coordinated_attack(cfg, 1, replies, {}, updates=True)  # the replies are Δ
    mean = np.stack([replies[c].weights["a"].numpy().astype(np.float64) for c in (1, 2, 3)]).mean(axis=0)
    np.testing.assert_allclose(out[0].weights["a"].numpy(), -0.5 * mean, rtol=1e-6, atol=1e-7)


def test_without_honest_clients_colluders_use_their_own_honest_updates():
    w0, replies, sent = synthetic_round(3, seed=4)
    cfg = digits_config(clients=3, faults__clients={str(c): "ipm" for c in range(3)})
    out = coordinated_attack(cfg, 1, replies, sent)
    expected = -0.5 * numpy_deltas(replies, w0, [0, 1, 2], "b").mean(axis=0)
    np.testing.assert_allclose(out[2].weights["b"].numpy() - w0["b"].numpy(), expected, atol=1e-6)


# -- adaptive-scale ------------------------------------------------------------------------------------------
def test_adaptive_scale_lands_just_under_the_update_norm_guards_bound():
    w0, replies, sent = synthetic_round(5, seed=5, spread=[0.3, 1.0, 1.5, 0.7, 2.0])
    cfg = digits_config(clients=5, faults__clients={"0": "adaptive-scale"})
    out = coordinated_attack(cfg, 1, replies, sent)
    norms = update_norms(out, sent)
    # The median the guard takes over all five, the attacker's included (numpy, independently)
    median = float(np.median(list(norms.values())))
    assert norms[0] == pytest.approx(0.99 * 10 * median, rel=1e-6)
    own = update_norms(replies, sent)[0]
    direction = (out[0].weights["a"].double() - w0["a"].double()) * own / norms[0]
    torch.testing.assert_close(
        direction, replies[0].weights["a"].double() - w0["a"].double(), rtol=1e-5, atol=1e-6
    )
    assert guard_updates(out, sent, cfg.guards) == {}  # accepted
    bigger = dict(out)
    bigger[0] = Reply(
        weights={
            k: (w0[k] + 1.02 * (v - w0[k])) if v.is_floating_point() else v for k, v in out[0].weights.items()
        },
        num_examples=out[0].num_examples,
    )
    assert list(guard_updates(bigger, sent, cfg.guards)) == [0]  # 1.02 × that: rejected


def test_adaptive_scale_aims_under_the_floor_where_the_floor_sets_the_bound():
    """With a global model of norm 10 000 the floor 0.01 × 10 000 = 100 is far above the round's median
    (~0.2): the guard's bound is 10 × 100, and the adversary lands at 0.99 of it (by hand: 990)."""
    w0, replies, sent = synthetic_round(5, seed=5, spread=[0.3, 1.0, 1.5, 0.7, 2.0])
    cfg = digits_config(clients=5, faults__clients={"0": "adaptive-scale"})
    out = coordinated_attack(cfg, 1, replies, sent, global_norm=10_000.0)
    norms = update_norms(out, sent)
    assert norms[0] == pytest.approx(990.0, rel=1e-6)
    assert guard_updates(out, sent, cfg.guards, global_norm=10_000.0) == {}  # accepted
    assert list(guard_updates(out, sent, cfg.guards)) == [0]  # the median's bound alone rejects it


def test_adaptive_scale_without_the_guard_scales_by_faults_factor():
    w0, replies, sent = synthetic_round(5, seed=6)
    cfg = digits_config(clients=5, faults__clients={"2": "adaptive-scale"}, faults__factor=7.0)
    cfg.guards.update_norm_factor = 0.0
    out = coordinated_attack(cfg, 1, replies, sent)
    expected = 7.0 * (replies[2].weights["b"].double() - w0["b"].double())
    torch.testing.assert_close(
        out[2].weights["b"].double() - w0["b"].double(), expected, rtol=1e-5, atol=1e-6
    )


def test_adaptive_scale_in_a_run_is_accepted_at_0_99_times_the_bound(tmp_path):
    cfg = digits_config(clients=5, rounds=2, faults__clients={"4": "adaptive-scale"})
    make_simulation(cfg, run_dir=tmp_path / "run").run()
    for line in lines_of(tmp_path / "run"):
        assert "rejected" not in line and 4 in line["clients"]
        norms = line["update_norms"]
        assert norms["4"] == pytest.approx(0.99 * 10 * float(np.median(list(norms.values()))), rel=1e-6)


# -- the clipping guard (guards.update_norm_clip): what bounds the adaptive-scale attack --------------------
def test_clipping_scales_only_the_updates_above_the_bound_down_to_it():
    """Bound = 2 × the median of the five norms (numpy, from the deltas themselves); only client 4 (spread 5)
    is above it: its Δ becomes Δ · bound / ‖Δ‖, the others are the very objects they were."""
    w0, replies, sent = synthetic_round(5, seed=7, spread=[0.3, 1.0, 1.5, 0.7, 5.0])
    ids = sorted(replies)
    deltas = [numpy_deltas(replies, w0, ids, k).reshape(5, -1) for k in ("a", "b")]
    own = np.linalg.norm(np.concatenate(deltas, axis=1), axis=1)
    bound = 2.0 * np.median(own)
    assert own[4] > bound and (own[:4] <= bound).all()  # the premise: only client 4 is above
    cfg = digits_config(clients=5, guards__update_norm_clip=2.0)
    out, scales = clip_updates(replies, sent, cfg.guards, update_norms(replies, sent))
    assert list(scales) == [4] and scales[4] == pytest.approx(bound / own[4], rel=1e-6)
    assert all(out[c] is replies[c] for c in range(4))
    for key in ("a", "b"):
        clipped = out[4].weights[key].numpy().astype(np.float64) - w0[key].numpy()
        np.testing.assert_allclose(
            clipped, numpy_deltas(replies, w0, [4], key)[0] * bound / own[4], rtol=1e-5
        )
    assert update_norms(out, sent)[4] == pytest.approx(bound, rel=1e-5)
    assert out[4].weights["n"] is replies[4].weights["n"]  # integer buffers untouched
    cfg.guards.update_norm_clip = 0.0
    assert clip_updates(replies, sent, cfg.guards, update_norms(replies, sent))[1] == {}  # off


def test_clipping_judges_nothing_in_rounds_of_fewer_than_three():
    w0, replies, sent = synthetic_round(2, seed=7, spread=[0.1, 9.0])
    cfg = digits_config(clients=2, guards__update_norm_clip=1.0)
    assert clip_updates(replies, sent, cfg.guards, update_norms(replies, sent))[1] == {}


def test_adaptive_scale_against_clipping_weighs_no_more_than_the_clip_bound(tmp_path):
    """The attacker lands at 9.9 × the median (under the rejecting bound) and is clipped to 2 × the median of
    the norms it sent: the line records the scale 2 · median / its norm."""
    cfg = digits_config(
        clients=5, rounds=2, faults__clients={"4": "adaptive-scale"}, guards__update_norm_clip=2.0
    )
    make_simulation(cfg, run_dir=tmp_path / "run").run()
    for line in lines_of(tmp_path / "run"):
        norms = line["update_norms"]
        median = float(np.median(list(norms.values())))
        assert 4 in line["clients"] and list(line["clipped"]) == ["4"]
        assert line["clipped"]["4"] == pytest.approx(2.0 * median / norms["4"], rel=1e-6)


def test_a_run_the_clipping_guard_never_acts_in_is_bit_identical_to_one_without_it(tmp_path):
    import torch as _torch

    plain = make_simulation(digits_config(clients=5, rounds=3), run_dir=tmp_path / "plain")
    plain.run()
    guarded = make_simulation(
        digits_config(clients=5, rounds=3, guards__update_norm_clip=50.0), run_dir=tmp_path / "g"
    )
    guarded.run()
    assert not any("clipped" in line for line in lines_of(tmp_path / "g"))
    for (k, a), b in zip(
        plain.strategy.global_model().state_dict().items(),
        guarded.strategy.global_model().state_dict().values(),
        strict=True,
    ):
        assert _torch.equal(a, b), k


def test_a_clipping_factor_under_one_is_refused_with_the_fix_named():
    with pytest.raises(ConfigError, match="guards.update_norm_clip=0.5 must be >= 1"):
        apply_override(digits_config(), "guards.update_norm_clip", "0.5")


# -- label-flip ----------------------------------------------------------------------------------------------
def _client_data() -> ClientData:
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(60, 1, 2, 2, generator=gen)
    labels = torch.arange(60) % 4
    return ClientData(cid=0, inputs=inputs, labels=labels, indices=torch.arange(10, 50), num_classes=4)


def _train(data: ClientData, fault_: Fault | None):
    model = build_model("mlp", (1, 2, 2), 4, hidden_sizes=[5])
    torch.manual_seed(0)
    start = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    train = TrainConfig(batch_size=8, lr=0.5, local_epochs=1.0)
    ctx = TrainContext(1, torch.Generator().manual_seed(1), torch.device("cpu"), train, model, {})
    ins = Instruction(weights=start, config={LR_KEY: 0.5})
    return run_client(SGDTrainer(), ins, ClientState(), data, ctx, fault_)[0]


def test_label_flip_trains_on_labels_k_minus_1_minus_y_of_its_own_data_only():
    data = _client_data()
    flipped_view = fault_data(fault("label-flip"), data)
    assert torch.equal(flipped_view.labels[data.indices], 3 - data.labels[data.indices])
    assert torch.equal(flipped_view.labels[:10], data.labels[:10])  # not its samples: untouched
    assert torch.equal(data.labels, torch.arange(60) % 4)  # the shared tensor is not altered
    assert torch.equal(flipped_view.class_counts(), data.class_counts().flip(0))
    # Trained by hand on the flipped labels (an honest client holding them): the same update, bit for bit
    by_hand = ClientData(0, data.inputs, (3 - data.labels), data.indices, 4)
    poisoned, honest = _train(data, fault("label-flip")), _train(data, None)
    for key in poisoned.weights:
        assert torch.equal(poisoned.weights[key], _train(by_hand, None).weights[key])
    assert not torch.equal(poisoned.weights["head.weight"], honest.weights["head.weight"])


# -- free-rider ----------------------------------------------------------------------------------------------
def test_free_rider_sends_the_model_it_was_sent_plus_seeded_gaussian_noise():
    start = {"w": torch.full((40000,), 2.0), "n": torch.tensor(4)}
    trained = Reply(weights={"w": torch.full((40000,), 5.0), "n": torch.tensor(5)}, num_examples=3)
    out = apply_fault(fault("free-rider", noise_std=0.01, seed=11), trained, start)
    noise = out.weights["w"] - 2.0
    expected = torch.randn(40000, generator=torch.Generator().manual_seed(11)) * 0.01
    torch.testing.assert_close(noise, expected, rtol=0, atol=1e-6)
    assert abs(noise.std().item() - 0.01) < 2e-4 and abs(noise.mean().item()) < 2e-4
    assert out.weights["n"].item() == 5 and out.num_examples == 3
    as_update = apply_fault(fault("free-rider", noise_std=0.01, seed=11), trained, {})  # uploads_updates
    torch.testing.assert_close(as_update.weights["w"], expected, rtol=0, atol=0)


# -- replay --------------------------------------------------------------------------------------------------
def test_replay_resends_its_first_update_in_later_rounds():
    memory: dict = {}
    start1, start2 = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([10.0, 20.0])}
    first = Reply(weights={"w": torch.tensor([1.5, 1.0])}, num_examples=4)
    assert apply_fault(fault("replay"), first, start1, memory) is first  # nothing to replay yet: honest
    memory = json.loads(json.dumps(memory))  # it lives in JSON (Flower's context.state)
    second = Reply(weights={"w": torch.tensor([13.0, 17.0])}, num_examples=4)
    out = apply_fault(fault("replay"), second, start2, memory)
    assert out.weights["w"].tolist() == [10.5, 19.0]  # start2 + (first − start1)
    third = apply_fault(fault("replay"), second, {"w": torch.tensor([0.0, 0.0])}, memory)
    assert third.weights["w"].tolist() == [0.5, -1.0]


def test_a_replaying_client_in_a_run_sends_the_same_update_every_round(tmp_path):
    cfg = digits_config(clients=5, rounds=4, faults__clients={"2": "replay"}, faults__from_round=2)
    sim = make_simulation(cfg, run_dir=tmp_path / "run")
    sim.run()
    norms = [line["update_norms"] for line in lines_of(tmp_path / "run")]
    assert norms[1]["2"] == pytest.approx(norms[2]["2"], rel=1e-5) == pytest.approx(norms[3]["2"], rel=1e-5)
    assert norms[0]["2"] != pytest.approx(norms[1]["2"], rel=1e-3)  # round 1: before the fault, honest
    assert norms[2]["0"] != pytest.approx(norms[3]["0"], rel=1e-3)  # honest clients' updates change
    assert "replay" in sim.transport.states[2].values[FAULT_MEMORY]
    assert FAULT_MEMORY not in sim.transport.states[0].values


def test_a_run_with_a_replaying_client_resumes_bit_identically(tmp_path):
    """The replayed update lives in the client's state, so a checkpoint carries it across a resume."""

    class Stop(Exception):
        pass

    def stop_after_3(rnd, total, line):
        if rnd == 3:
            raise Stop

    cfg = digits_config(clients=4, rounds=4, faults__clients={"1": "replay", "2": "alie"})
    cfg.eval.checkpoint_every = 2
    make_simulation(cfg, run_dir=tmp_path / "full").run()
    with pytest.raises(Stop):
        make_simulation(cfg, run_dir=tmp_path / "cut", progress=stop_after_3).run()
    make_simulation(cfg, run_dir=tmp_path / "cut", resume=True).run()  # from round 2's checkpoint
    assert (tmp_path / "cut" / "metrics.jsonl").read_bytes() == (
        tmp_path / "full" / "metrics.jsonl"
    ).read_bytes()


# -- timing --------------------------------------------------------------------------------------------------
def test_every_attacks_only_on_its_beat_from_from_round(tmp_path):
    cfg = digits_config(faults__clients={"1": "alie"}, faults__from_round=2, faults__every=2)
    assert [r for r in range(1, 10) if fault_for(cfg, 1, r) is not None] == [2, 4, 6, 8]
    cfg = digits_config(clients=5, rounds=5, faults__clients={"0": "scale"}, faults__from_round=2)
    cfg.faults.every = 2
    make_simulation(cfg, run_dir=tmp_path / "run").run()
    assert [line["round"] for line in lines_of(tmp_path / "run") if "rejected" in line] == [2, 4]


def test_the_new_settings_are_validated_with_the_fix_named():
    for key, value, match in [
        ("faults.every", "0", "faults.every=0 must be >= 1"),
        ("faults.z", "-1", "faults.z=-1.0 must be >= 0"),
        ("faults.epsilon", "0", "faults.epsilon=0.0 must be > 0"),
        ("faults.clients.0", "alie2", "not a fault; choose one of .*adaptive-scale"),
    ]:
        with pytest.raises(ConfigError, match=match):
            apply_override(digits_config(), key, value)


# -- reproducible --------------------------------------------------------------------------------------------
def test_every_new_attack_in_one_run_is_bit_identical_twice(tmp_path):
    attacks = {
        "0": "alie",
        "1": "ipm",
        "2": "adaptive-scale",
        "3": "label-flip",
        "4": "free-rider",
        "5": "replay",
    }
    for name in ("a", "b"):
        cfg = digits_config(clients=8, rounds=3, faults__clients=attacks, faults__noise_std=0.01)
        make_simulation(cfg, run_dir=tmp_path / name).run()
    first = (tmp_path / "a" / "metrics.jsonl").read_bytes()
    assert first == (tmp_path / "b" / "metrics.jsonl").read_bytes()
    clean = digits_config(clients=8, rounds=3)
    make_simulation(clean, run_dir=tmp_path / "clean").run()
    assert lines_of(tmp_path / "a")[-1]["accuracy"] != lines_of(tmp_path / "clean")[-1]["accuracy"]


# -- on Flower -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_attacks_act_on_flower_as_in_the_embedded_engine(tmp_path):
    """The coordinated step and the clipping guard run in the shared round loop; label-flip and replay on the
    nodes (replay's memory in Flower's context.state, as JSON): metrics.jsonl bit for bit as the embedded
    engine's."""
    pytest.importorskip("flwr", reason="the Flower tests need fedhet[flower]")
    from fedhet.flower.server import run_flower_simulation

    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "iid", 4
    cfg.data.max_train_samples, cfg.data.max_test_samples = 800, 200
    cfg.train.rounds, cfg.train.local_steps, cfg.train.batch_size, cfg.train.threads = 3, 3, 16, 1
    cfg.eval.fairness = False
    cfg.faults.clients = {"0": "alie", "1": "replay", "2": "label-flip"}
    cfg.guards.update_norm_clip = 1.0  # every update above the round's median clipped: the guard acts too
    run_flower_simulation(cfg, tmp_path / "flower")
    make_simulation(cfg, run_dir=tmp_path / "embedded").run()
    flower, embedded = lines_of(tmp_path / "flower"), lines_of(tmp_path / "embedded")
    assert flower == embedded
    assert all(line["clipped"] for line in embedded)
    norms = [line["update_norms"]["1"] for line in embedded]
    assert norms[1] == pytest.approx(norms[0], rel=1e-5) == pytest.approx(norms[2], rel=1e-5)  # replayed
