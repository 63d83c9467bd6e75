"""CFFL, CGSV, ShapFed and IAFL: known-answer checks of each core formula, the shared own-model protocol
(reward delivery, re-synchronisation after missed rounds), end-to-end runs with dropped and rejected
clients, checkpoint/resume, fairness reporting and the shipped config files."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedhet.algorithms import build_strategy
from fedhet.algorithms.cffl import CFFL, cffl_reputation_update
from fedhet.algorithms.cgsv import CGSV, cgsv_reputation_update, cgsv_reward_fractions
from fedhet.algorithms.iafl import IAFL, iafl_reward_rates, iafl_reward_set_sizes
from fedhet.algorithms.own_model import (
    LOCAL_UPDATE_PREFIX,
    OwnModelTrainer,
    clip_elementwise,
    normalise_update,
    topk_global,
    topk_per_layer,
    update_norm,
)
from fedhet.algorithms.shapfed import (
    ShapFed,
    exact_shapley_scores,
    grand_coalition_scores,
    monte_carlo_shapley_scores,
)
from fedhet.config import ExperimentConfig, TrainConfig, load_config
from fedhet.engine.protocol import FederationInfo, Reply
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from fedhet.models.registry import FedModel
from support import local_update

METHODS = ("cffl", "cgsv", "shapfed", "iafl")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


# --------------------------------------------------------------------------------------------------------
# Fixtures: a tiny linear model and a hand-made server context (strategy-level known answers)
# --------------------------------------------------------------------------------------------------------
class Tiny(FedModel):
    """features = the 3 inputs; head = Linear(3 -> 2); all weights start at zero."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, 2)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def features(self, x):
        return x.flatten(1)


def tiny_setup(strategy, sizes, *, validation=True, class_counts=None, score=None):
    """``strategy`` set up on a 2-class federation of ``Tiny`` models with the given self-reported sizes and
    class counts (the round-0 descriptions); ``score`` replaces CFFL's validation accuracy."""
    n = len(sizes)
    counts = np.ones((n, 2), dtype=np.int64) if class_counts is None else np.asarray(class_counts)
    info = FederationInfo(
        model=Tiny(),
        num_clients=n,
        num_classes=2,
        input_shape=(3,),
        rounds=10,
        seed=0,
        rng=np.random.default_rng(0),
        device=torch.device("cpu"),
        validation=(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)) if validation else None,
    )
    strategy.setup(info)
    strategy.receive_descriptions(
        {
            cid: Reply(
                weights={}, num_examples=int(size), payload={"class_counts": torch.as_tensor(counts[cid])}
            )
            for cid, size in enumerate(sizes)
        }
    )
    if score is not None:
        strategy.validation_score = score
    return strategy


def update(weight, bias) -> dict[str, torch.Tensor]:
    return {
        "head.weight": torch.tensor(weight, dtype=torch.float32),
        "head.bias": torch.tensor(bias, dtype=torch.float32),
    }


def reply(u) -> Reply:
    return Reply(weights=u, num_examples=1)


# --------------------------------------------------------------------------------------------------------
# Update arithmetic
# --------------------------------------------------------------------------------------------------------
def test_topk_per_layer_keeps_ceil_fraction_of_each_tensor():
    u = {"a": torch.tensor([3.0, -5.0, 1.0, 0.5]), "b": torch.tensor([[0.1, -0.2], [0.3, 0.0]])}
    out = topk_per_layer(u, 0.3, ["a", "b"])  # ⌈1.2⌉ = 2 entries per tensor
    assert out["a"].tolist() == [3.0, -5.0, 0.0, 0.0]
    torch.testing.assert_close(out["b"], torch.tensor([[0.0, -0.2], [0.3, 0.0]]))
    assert topk_per_layer(u, 1.0, ["a"])["a"].tolist() == u["a"].tolist()
    assert topk_per_layer(u, 0.0, ["a"])["a"].tolist() == [0.0] * 4
    assert topk_per_layer(u, 0.5, ["a"])["b"] is u["b"]  # keys not listed are untouched


def test_topk_global_ranks_across_tensors_and_clip_and_normalise():
    u = {"a": torch.tensor([3.0, -5.0]), "b": torch.tensor([4.0, 0.5, -6.0])}
    out = topk_global(u, 3, ["a", "b"])
    assert out["a"].tolist() == [0.0, -5.0] and out["b"].tolist() == [4.0, 0.0, -6.0]
    assert all(float(v.abs().sum()) == 0 for v in topk_global(u, 0, ["a", "b"]).values())
    assert clip_elementwise(u, 1.0, ["a"])["a"].tolist() == [1.0, -1.0]
    scaled = normalise_update(u, ["a", "b"], 0.5)  # Γ·Δ/(‖Δ‖ + 1e-7)
    assert update_norm(scaled, ["a", "b"]) == pytest.approx(0.5, rel=1e-6)
    small = {"a": torch.tensor([0.03, 0.04])}  # ‖Δ‖ = 0.05 < Γ: 'clip' leaves it alone
    assert normalise_update(small, ["a"], 0.15, mode="clip")["a"].tolist() == small["a"].tolist()
    assert update_norm(normalise_update(small, ["a"], 0.15), ["a"]) == pytest.approx(0.15, rel=1e-5)


# --------------------------------------------------------------------------------------------------------
# CGSV
# --------------------------------------------------------------------------------------------------------
def test_cgsv_reputation_ema_clamp_and_normalisation_known_answer():
    r = cgsv_reputation_update(np.zeros(3), np.array([1.0, 0.5, -1.0]), momentum=0.95)
    # 0.05·ψ = [0.05, 0.025, -0.05] -> clamp at 1e-3 -> / 0.076
    np.testing.assert_allclose(r, np.array([0.05, 0.025, 0.001]) / 0.076)
    # the mask skips the EMA step for a client that sent nothing (it keeps 0.3 before normalising)
    r2 = cgsv_reputation_update(
        np.array([0.5, 0.3, 0.2]), np.array([1.0, 0.0, 0.0]), 0.9, mask=np.array([1, 0, 1])
    )
    raw = np.array([0.9 * 0.5 + 0.1, 0.3, 0.9 * 0.2])
    np.testing.assert_allclose(r2, raw / raw.sum())


def test_cgsv_tanh_reward_fractions_known_answer():
    q = cgsv_reward_fractions(np.array([0.5, 0.3, 0.2]), altruism=1.0)
    np.testing.assert_allclose(q, [1.0, math.tanh(0.3) / math.tanh(0.5), math.tanh(0.2) / math.tanh(0.5)])
    assert q[1] == pytest.approx(0.630387, abs=1e-6)  # 0.291313 / 0.462117
    np.testing.assert_allclose(cgsv_reward_fractions(np.array([0.5, 0.3, 0.2]), 1e7), [1.0, 1.0, 1.0])


def test_cgsv_server_round_known_answer():
    s = CGSV(update_norm=0.5, altruism=1.0)
    tiny_setup(s, [3, 1])
    u0 = update([[3.0, 0, 0], [0, 0, 0]], [0, 0])  # ‖·‖ = 3 -> Γ·e1
    u1 = update([[0, 4.0, 0], [0, 0, 0]], [0, 0])  # ‖·‖ = 4 -> Γ·e2
    s.configure(1, [0, 1])
    s.aggregate(1, {0: reply(u0), 1: reply(u1)})
    # round 1 weights = data shares [0.75, 0.25]: u = 0.5·(0.75 e1 + 0.25 e2)
    expected_u = torch.tensor([[0.375, 0.125, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(s.model.head.weight.detach(), expected_u, atol=1e-6, rtol=0)
    # ψ = cos(e1, u) = 0.75/√0.625, cos(e2, u) = 0.25/√0.625: ratio 3:1 -> r = [0.75, 0.25]
    np.testing.assert_allclose(s.reputations, [0.75, 0.25], rtol=1e-6)
    np.testing.assert_allclose(s.last_scores, [0.75 / math.sqrt(0.625), 0.25 / math.sqrt(0.625)], rtol=1e-6)
    q1 = math.tanh(0.25) / math.tanh(0.75)
    assert s.reward_fractions[1] == pytest.approx(q1, rel=1e-6)
    # client 0 (top) gets all of u, client 1 the per-layer top ⌈q1·|layer|⌉ of u; both reset to 0 first
    torch.testing.assert_close(s.client_models[0]["head.weight"], expected_u, atol=1e-6, rtol=0)
    assert int((s.client_models[1]["head.weight"] != 0).sum()) <= math.ceil(q1 * 6)
    torch.testing.assert_close(s.pending[1]["head.weight"], s.client_models[1]["head.weight"])
    # the next instruction delivers the pending rewards as deltas
    ins = s.configure(2, [0, 1])
    assert ins[0].delta and ins[1].delta
    torch.testing.assert_close(ins[0].weights["head.weight"], expected_u, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------------------
# CFFL
# --------------------------------------------------------------------------------------------------------
def test_cffl_reputation_sinh_threshold_and_dropping_known_answer():
    scores = np.array([0.9, 0.6, 0.03])
    r, kept, thr = cffl_reputation_update(np.zeros(3), [0, 1, 2], 1 / 9, scores, 5.0, 1 / 3)
    ema = 0.2 * scores / scores.sum()
    sinh = np.array([math.sinh(5 * v) for v in ema])
    before = sinh / sinh.sum()  # [0.596, 0.385, 0.0188]: client 2 is below 1/9 and leaves R
    assert before[2] < 1 / 9 < before[1]
    assert kept == [0, 1]
    np.testing.assert_allclose(r, [before[0] / before[:2].sum(), before[1] / before[:2].sum(), 0.0])
    assert thr == pytest.approx(1 / 6)  # coef / |R| recomputed for |R| = 2
    # no change of R: the threshold stays, reputations are sinh-sharpened again
    r2, kept2, thr2 = cffl_reputation_update(r, kept, thr, np.array([0.5, 0.5, 0.9]), 5.0, 1 / 3)
    assert kept2 == [0, 1] and thr2 == pytest.approx(1 / 6) and r2[2] == 0.0
    raw = np.sinh(5 * (0.8 * r[:2] + 0.2 * 0.5))
    np.testing.assert_allclose(r2[:2], raw / raw.sum())


def test_cffl_server_round_scores_aggregates_and_sizes_downloads():
    # score = 0.5 + head.bias[0] of (server model + filtered upload): the uploads set the scores
    s = tiny_setup(
        CFFL(upload_fraction=0.5, update_clip=None),
        [200, 100, 100],
        score=lambda m: 0.5 + float(m.head.bias[0].detach()),
    )
    assert s.threshold == pytest.approx(1 / 9)
    u0 = update([[0.01, 0.02, 0.03], [0.04, 0.05, 0.06]], [0.4, 0.0])
    u1 = update([[-0.06, 0.0, 0.0], [0.0, 0.0, 0.02]], [0.1, 0.0])
    u2 = update([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [-0.47, 0.0])
    s.configure(1, [0, 1, 2])
    s.aggregate(1, {0: reply(u0), 1: reply(u1), 2: reply(u2)})
    np.testing.assert_allclose(s.last_scores, [0.9, 0.6, 0.03], atol=1e-6)
    assert s.reputable == [0, 1] and s.reputations[2] == 0.0
    # aggregate over R with p_i = n_i/Σn = [0.5, 0.25]
    agg_w = 0.5 * u0["head.weight"] + 0.25 * u1["head.weight"]
    agg_b = 0.5 * u0["head.bias"] + 0.25 * u1["head.bias"]
    torch.testing.assert_close(s.model.head.weight.detach(), agg_w)
    torch.testing.assert_close(s.model.head.bias.detach(), agg_b)
    # client 0: (r/max r)·(n/max n) = 1 -> the whole aggregate, minus its own upload·(200/200)
    torch.testing.assert_close(s.pending[0]["head.weight"], agg_w - u0["head.weight"])
    # client 1: fraction (r1/r0)·0.5 -> int(fraction·8) entries (the two largest: bias0, weight[1][2])
    fraction = s.reputations[1] / s.reputations[0] * 0.5
    assert int(fraction * 8) == 2
    expect_w = torch.zeros(2, 3)
    expect_w[1, 2] = agg_w[1, 2]
    torch.testing.assert_close(s.pending[1]["head.weight"], expect_w - 0.5 * u1["head.weight"])
    torch.testing.assert_close(
        s.pending[1]["head.bias"], torch.tensor([agg_b[0], 0.0]) - 0.5 * u1["head.bias"]
    )
    # client 2 left R: no download; its own model keeps only its local update
    assert 2 not in s.pending
    torch.testing.assert_close(s.client_models[2]["head.bias"], u2["head.bias"])


def test_cffl_needs_a_validation_set_and_class_imbalance_weights():
    assert CFFL().requirements() == {"validation"}  # the engine refuses a run without one (test_engine)
    s = CFFL(class_imbalance=True)
    tiny_setup(s, [5, 5], class_counts=[[3, 0], [2, 2]])
    np.testing.assert_allclose(s.aggregation_weights_, [0.5, 1.0])  # classes_i / K
    np.testing.assert_allclose(s.size_fraction, [0.5, 1.0])  # classes_i / max classes
    assert s.threshold == pytest.approx((1 / 6) / 2)  # coef 1/6 for the class-imbalance split


def test_own_model_trainer_clips_filters_and_keeps():
    from fedhet.engine.protocol import ClientData, Instruction

    model = Tiny()
    data = ClientData(
        cid=0,
        inputs=torch.randn(20, 3),
        labels=torch.randint(0, 2, (20,)),
        indices=torch.arange(20),
        num_classes=2,
    )
    train = TrainConfig(lr=1.0, batch_size=20)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    ins = Instruction(
        weights=dict(initial), config={"local_update": "keep", "update_clip": 0.01, "upload_fraction": 0.25}
    )
    rep, state = local_update(OwnModelTrainer(), model, data, ins, train)
    kept = {k[len(LOCAL_UPDATE_PREFIX) :]: v for k, v in rep.payload.items()}
    assert float(max(v.abs().max() for v in kept.values())) <= 0.01 + 1e-9  # clipped element-wise
    assert int(sum((v != 0).sum() for v in rep.weights.values())) == int(0.25 * 8)  # top-θ upload
    for k in kept:  # the client keeps its full clipped update
        torch.testing.assert_close(state.weights[k], initial[k] + kept[k])
    ins = Instruction(weights=dict(initial), config={"local_update": "reset"})
    _, state2 = local_update(OwnModelTrainer(), model, data, ins, train)
    for k in state2.weights:  # CGSV/IAFL clients reset to where they started
        torch.testing.assert_close(state2.weights[k], initial[k])


# --------------------------------------------------------------------------------------------------------
# ShapFed
# --------------------------------------------------------------------------------------------------------
def test_shapfed_grand_coalition_cosine_known_answer():
    vectors = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)  # 2 clients, 1 class
    s = grand_coalition_scores(vectors, torch.tensor([0.5, 0.5], dtype=torch.float64))
    np.testing.assert_allclose(s.numpy(), [[1 / math.sqrt(2)], [1 / math.sqrt(2)]])
    s = grand_coalition_scores(vectors, torch.tensor([0.75, 0.25], dtype=torch.float64))
    np.testing.assert_allclose(s.numpy(), [[0.75 / math.sqrt(0.625)], [0.25 / math.sqrt(0.625)]])


def test_shapfed_exact_shapley_three_clients_by_hand():
    # one class, g1 = (1,0), g2 = (0,1), g3 = (1,1), equal weights; G(all) ∝ (1,1)
    vectors = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]], dtype=torch.float64)
    w = torch.full((3,), 1 / 3, dtype=torch.float64)
    v1 = v2 = 1 / math.sqrt(2)  # cos((1,0),(1,1))
    v3 = v12 = v123 = 1.0
    v13 = v23 = 3 / math.sqrt(10)  # cos((1,.5),(1,1)) = 1.5/(√1.25·√2)
    phi1 = v1 / 3 + (v12 - v2) / 6 + (v13 - v3) / 6 + (v123 - v23) / 3
    phi3 = v3 / 3 + (v13 - v1) / 6 + (v23 - v2) / 6 + (v123 - v12) / 3
    assert phi1 == pytest.approx(0.293071, abs=1e-6) and phi3 == pytest.approx(0.413859, abs=1e-6)
    exact = exact_shapley_scores(vectors, w).numpy()[:, 0]
    np.testing.assert_allclose(exact, [phi1, phi1, phi3], atol=1e-12)
    assert exact.sum() == pytest.approx(v123)  # efficiency
    mc = monte_carlo_shapley_scores(vectors, w, 2000, np.random.default_rng(0)).numpy()[:, 0]
    assert mc.sum() == pytest.approx(v123)  # every sampled ordering is efficient
    np.testing.assert_allclose(mc, exact, atol=0.03)


def test_shapfed_exact_shapley_refuses_large_federations():
    with pytest.raises(ConfigError, match="monte-carlo"):
        tiny_setup(ShapFed(contribution="exact-shapley", max_exact_clients=3), [1, 1, 1, 1])


def test_shapfed_round_weights_aggregation_and_personalised_reward():
    s = ShapFed(ema_momentum=0.5)
    tiny_setup(s, [1, 1])
    # g = −Δ on the head; class 0 rows point the same way, class 1 rows differ
    u0 = update([[-1.0, 0, 0], [0, -1.0, 0]], [0, 0])
    u1 = update([[-1.0, 0, 0], [0, 0, -1.0]], [0, 0])
    s.configure(1, [0, 1])
    s.aggregate(1, {0: reply(u0), 1: reply(u1)})
    # class 0: both cos = 1; class 1: both cos = 1/√2 -> γ = (1 + 1/√2)/2 for both, weights 1/2
    gamma = (1 + 1 / math.sqrt(2)) / 2
    np.testing.assert_allclose(s.gamma, [gamma, gamma])
    np.testing.assert_allclose(s.contributions(), [0.5, 0.5])
    torch.testing.assert_close(s.model.head.weight.detach(), 0.5 * (u0["head.weight"] + u1["head.weight"]))
    # reward_scale 'max': c = γ/max γ = 1 for both -> each client ends with the global model
    for cid in (0, 1):
        torch.testing.assert_close(s.client_models[cid]["head.weight"], s.model.head.weight.detach())
    # EMA: a second round where client 1's class-1 row matches client 0's
    s.configure(2, [0, 1])
    s.aggregate(2, {0: reply(u0), 1: reply(u0)})
    np.testing.assert_allclose(s.gamma, [0.5 * gamma + 0.5, 0.5 * gamma + 0.5])


# --------------------------------------------------------------------------------------------------------
# IAFL
# --------------------------------------------------------------------------------------------------------
def test_iafl_reward_rates_and_set_sizes_known_answer():
    np.testing.assert_allclose(iafl_reward_rates(np.array([100, 50, 10])), [1.0, 0.5, 0.1])
    rates = np.array([1.0, 0.5, 0.1])
    assert iafl_reward_set_sizes(rates, 0.0, 5).tolist() == [4, 2, 1]  # ⌈[4, 2, 0.4]⌉
    assert iafl_reward_set_sizes(rates, 0.5, 5).tolist() == [4, 3, 2]  # ⌈[4, 2.83, 1.26]⌉
    assert iafl_reward_set_sizes(np.array([0.3]), 0.0, 11).tolist() == [3]  # 0.3·10, not 4 by rounding
    assert iafl_reward_set_sizes(rates, 0.0, 0).tolist() == [0, 0, 0]  # nobody joined


def test_iafl_full_reward_sets_recovery_and_reference_model():
    s = IAFL(recovery_probability=0.0)
    tiny_setup(s, [10, 10, 10])
    us = [update([[float(i + 1), 0, 0], [0, 0, 0]], [0, float(-i)]) for i in range(3)]
    s.configure(1, [0, 1, 2])
    s.aggregate(1, {i: reply(us[i]) for i in range(3)})
    assert s.last_sizes.tolist() == [2, 2, 2]  # equal sizes: γ = 1, k = |J| − 1
    mean_w = sum(u["head.weight"] for u in us) / 3
    for cid in range(3):  # everyone averages all three updates
        torch.testing.assert_close(s.client_models[cid]["head.weight"], mean_w)
    torch.testing.assert_close(s.model.head.weight.detach(), mean_w)  # the top contributor's set
    r = IAFL(recovery_probability=1.0)
    tiny_setup(r, [10, 5])
    r.model.head.bias.data.fill_(0.7)
    ins = r.configure(1, [0, 1])
    assert not ins[0].delta and float(ins[0].weights["head.bias"][0]) == pytest.approx(0.7)


# --------------------------------------------------------------------------------------------------------
# Rounds in which clients send nothing
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_a_round_with_no_replies_does_not_fail_and_resyncs(method):
    s = build_strategy(method)
    tiny_setup(s, [3, 2, 1], score=lambda m: 0.5)
    before = {k: v.clone() for k, v in s.model.state_dict().items()}
    s.configure(1, [0, 1, 2])
    s.aggregate(1, {})
    after = s.model.state_dict()
    if method != "shapfed":
        assert all(torch.equal(before[k], after[k]) for k in before)
    ins = s.configure(2, [0, 1, 2])
    assert all(not i.delta and set(i.weights) == set(before) for i in ins.values())  # full re-sync
    s.aggregate(2, {0: reply(update([[0.1, 0, 0], [0, 0, 0]], [0.0, 0.1]))})  # one reply only
    c = s.contributions()
    assert c is None or bool(np.all(np.isfinite(c)))


def small_config(method: str, **over) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "dirichlet-per-client", 4
    cfg.data.split_params = {"alpha": 0.5}
    cfg.data.max_train_samples, cfg.data.max_test_samples = 2400, 1000
    cfg.data.validation_fraction = 0.1
    cfg.train.rounds, cfg.train.batch_size, cfg.train.lr = 4, 64, 0.1
    cfg.eval.fairness = False
    cfg.eval.checkpoint_every = 1
    cfg.method.name = method
    for k, v in over.items():
        section, key = k.split("__")
        setattr(getattr(cfg, section), key, v)
    return cfg


def assert_mirrors_match_clients(sim) -> None:
    """Every in-sync client's own model + its pending reward equals the server's mirror of it."""
    st = sim.strategy
    for cid, cs in sim.client_states.items():
        if cid in st.resync:
            continue
        own = cs.weights if cs.weights is not None else st.initial_weights
        pending = st.pending.get(cid, {})
        for k in own:
            expect = own[k] + pending[k] if k in pending else own[k]
            torch.testing.assert_close(expect, st.client_models[cid][k], atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", METHODS)
def test_end_to_end_with_dropped_clients(method, tmp_path):
    cfg = small_config(method, train__client_dropout=0.4)
    sim = make_simulation(cfg, run_dir=tmp_path / "r")
    summary = sim.run()
    lines = [json.loads(s) for s in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any(line.get("dropped") for line in lines)
    assert math.isfinite(summary["final"]["accuracy"]) and summary["final"]["accuracy"] > 0.2
    assert len(summary["rewards"]) == 4 and all(0 <= a <= 1 for a in summary["rewards"])
    assert summary["contributions"] is not None and len(summary["contributions"]) == 4
    assert (tmp_path / "r" / f"{method}_clients.csv").is_file()
    assert_mirrors_match_clients(sim)


class NaNForClient1(OwnModelTrainer):
    def finish(self, u, metrics):
        rep = super().finish(u, metrics)
        if u.data.cid == 1:
            key = next(iter(rep.weights))
            rep.weights[key] = torch.full_like(rep.weights[key], float("nan"))
        return rep


@pytest.mark.parametrize("method", METHODS)
def test_rejected_updates_leave_the_method_running(method, tmp_path):
    cfg = small_config(method, train__rounds=3)
    sim = make_simulation(cfg, run_dir=tmp_path / "r", trainer=NaNForClient1())
    summary = sim.run()
    lines = [json.loads(s) for s in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert all(set(line["rejected"]) == {"1"} for line in lines)
    assert math.isfinite(summary["final"]["accuracy"])
    assert 1 in sim.strategy.resync
    assert all(math.isfinite(a) for a in summary["rewards"])


@pytest.mark.parametrize("method", METHODS)
def test_interrupted_run_resumes_identically(method, tmp_path):
    cfg = small_config(method, train__client_dropout=0.25, train__rounds=4)
    make_simulation(cfg, run_dir=tmp_path / "full").run()

    class Stop(Exception):
        pass

    def stop_at_3(rnd, total, line):
        if rnd == 3:
            raise Stop

    with pytest.raises(Stop):
        make_simulation(cfg, run_dir=tmp_path / "cut", progress=stop_at_3).run()
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "round_00003")
    make_simulation(cfg, run_dir=tmp_path / "cut", resume=True).run()
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == (
        tmp_path / "full" / "metrics.jsonl"
    ).read_text()


def test_fairness_and_contribution_correlations_are_reported_for_all_four(tmp_path):
    standalone = np.array([0.55, 0.6, 0.7, 0.8])
    for method, params in (
        ("cffl", {"class_imbalance": True}),
        ("cgsv", {}),
        ("shapfed", {}),
        ("iafl", {"contribution": "standalone"}),
    ):
        cfg = small_config(method, train__rounds=2)
        cfg.data.split, cfg.data.split_params = "cla", {"samples_per_client": 300}
        cfg.method.params = params
        cfg.eval.fairness = True
        summary = make_simulation(cfg, reference_contributions=standalone).run()
        for key in ("fairness_pearson", "bcf_rate", "bcf_rate_code", "ipr", "contribution_fairness_pearson"):
            assert key in summary["final"], (method, key)
        if method == "iafl":  # contributions = standalone accuracies (normalised): correlation 100
            assert summary["final"]["contribution_fairness_pearson"] == pytest.approx(100.0)


def test_state_dict_round_trips_through_a_checkpoint(tmp_path):
    from fedhet.engine.checkpoint import load_checkpoint, save_checkpoint

    for method in METHODS:
        cfg = small_config(method, train__rounds=2, train__client_dropout=0.3)
        sim = make_simulation(cfg)
        sim.run()
        sd = sim.strategy.state_dict()
        path = save_checkpoint(tmp_path / method, {"s": sd})
        fresh = build_strategy(method)
        fresh.setup(sim.info)
        fresh.receive_descriptions(sim.describe_clients())
        fresh.load_state_dict(load_checkpoint(path)["s"])
        again = fresh.state_dict()
        assert sorted(again) == sorted(sd)
        for cid, w in sd["client_models"].items():
            assert all(torch.equal(w[k], again["client_models"][cid][k]) for k in w)
        assert again["resync"] == sd["resync"] and sorted(again["pending"]) == sorted(sd["pending"])
        np.testing.assert_array_equal(fresh.contributions(), sim.strategy.contributions())


def test_parameters_are_validated_with_config_errors():
    bad = [
        ("cgsv", {"altruism": 0}),
        ("cgsv", {"normalization": "l1"}),
        ("cffl", {"upload_fraction": 1.5}),
        ("cffl", {"largest_criterion": "row"}),
        ("shapfed", {"contribution": "loo"}),
        ("shapfed", {"ema_momentum": 1.0}),
        ("iafl", {"sharing": 1.0}),
        ("iafl", {"contribution": "participation"}),
    ]
    for method, params in bad:
        with pytest.raises(ConfigError, match="method.params"):
            build_strategy(method, params)
    no_clip = build_strategy("cffl", {"update_clip": 0})  # 0 disables clipping (TOML has no None)
    assert no_clip.update_clip is None


def test_shipped_baseline_configs_load():
    files = sorted((ROOT / "configs" / "baselines").glob("*.toml"))
    assert len(files) >= 4
    seen = set()
    for f in files:
        cfg = load_config(f)
        build_strategy(cfg.method.name, cfg.method.params)
        seen.add(cfg.method.name)
        if cfg.method.name == "cffl":
            assert cfg.data.validation_fraction > 0
    assert set(METHODS) <= seen


@pytest.mark.parametrize("contribution", ["exact-shapley", "monte-carlo"])
def test_shapfed_paper_shapley_variants_run_end_to_end(contribution):
    cfg = small_config("shapfed", train__rounds=2, train__client_dropout=0.2)
    cfg.method.params = {"contribution": contribution, "permutations": 20, "reward_scale": "sum"}
    sim = make_simulation(cfg)
    summary = sim.run()
    c = np.array(summary["contributions"])
    assert c.shape == (4,) and np.all(c >= 0) and c.sum() == pytest.approx(1.0)
    assert math.isfinite(summary["final"]["accuracy"])
    assert_mirrors_match_clients(sim)


# --------------------------------------------------------------------------------------------------------
# The 'global' protocol (CELM's tables) and ShapFed's normalisation of γ
# --------------------------------------------------------------------------------------------------------
def test_shapfed_normalised_weights_known_answers():
    from fedhet.algorithms.shapfed import normalised_weights

    gamma = np.array([0.6, -0.2, 0.6])
    np.testing.assert_allclose(
        normalised_weights(gamma, "sum"), [0.6, -0.2, 0.6]
    )  # Σγ = 1: γ/Σγ, negatives kept
    np.testing.assert_allclose(normalised_weights(gamma, "clip"), [0.5, 0.0, 0.5])
    e = np.exp(gamma)
    np.testing.assert_allclose(normalised_weights(gamma, "softmax"), e / e.sum())
    np.testing.assert_allclose(
        normalised_weights(np.array([-1.0, 0.5]), "sum"), [0.5, 0.5]
    )  # Σγ ≤ 0: uniform


def test_shapfed_negative_gamma_weights_the_aggregate_by_default_and_clip_zeroes_it(caplog):
    """Three clients; client 1's class-0 head row points against the others', so its γ is negative:
    γ/Σγ (the paper and code) gives it a negative weight, and a warning names the fix; 'clip' gives it
    none. Cosines in numpy."""
    g = {  # class-wise "gradients" g = −Δ: rows (class 0, class 1) of the head weight; biases 0
        0: [[1.0, 0, 0], [0, 1.0, 0]],
        1: [[-1.0, 0, 0], [0, 1.0, 1.0]],
        2: [[1.0, 0, 0], [0, 1.0, 0]],
    }
    gamma = []
    for cid in range(3):
        cos = []
        for c in range(2):
            full = np.mean([np.array(g[j][c] + [0.0]) for j in range(3)], axis=0)
            v = np.array(g[cid][c] + [0.0])
            cos.append(v @ full / np.linalg.norm(v) / np.linalg.norm(full))
        gamma.append(np.mean(cos))
    gamma = np.array(gamma)
    assert gamma[1] < 0 < gamma[0]
    for mode, expected in (
        ("sum", gamma / gamma.sum()),
        ("clip", np.clip(gamma, 0, None) / np.clip(gamma, 0, None).sum()),
    ):
        s = ShapFed(score_weights=mode)
        tiny_setup(s, [1, 1, 1])
        caplog.clear()
        ups = {c: reply(update([[-x for x in row] for row in g[c]], [0.0, 0.0])) for c in range(3)}
        with caplog.at_level(logging.WARNING, logger="fedhet"):
            s.configure(1, [0, 1, 2])
            s.aggregate(1, ups)
            np.testing.assert_allclose(s.gamma, gamma)
            np.testing.assert_allclose(s.contributions(), expected)
            head = s.model.head.weight.detach().numpy().copy()
            s.configure(2, [0, 1, 2])
            s.aggregate(2, ups)  # the warning comes once per run
        warnings = [r.getMessage() for r in caplog.records if "left the simplex" in r.getMessage()]
        assert len(warnings) == (1 if mode == "sum" else 0)
        assert mode == "clip" or "score_weights=clip" in warnings[0]
        # ShapFed-WA: the round-1 global model is Σ_i w_i (w_init + Δ_i) with those weights
        deltas = np.stack([-np.array(g[c]) for c in range(3)])
        np.testing.assert_allclose(head, np.tensordot(expected, deltas, 1), atol=1e-6)


@pytest.mark.parametrize("method", ["shapfed", "cffl", "cgsv", "iafl"])
def test_the_global_protocol_restarts_every_client_from_the_global_model(method):
    s = build_strategy(method, {"protocol": "global"})
    tiny_setup(s, [3, 2, 1], score=lambda m: 0.5 + float(m.head.bias[0].detach()))
    assert not s.has_rewards() and s.reward_model(0) is None
    ups = {0: update([[0.1, 0, 0], [0, 0, 0]], [0.01, 0]), 1: update([[0, 0.2, 0], [0, 0, 0]], [0, 0.02])}
    for rnd in (1, 2):
        before = {k: v.clone() for k, v in s.model.state_dict().items()}
        instructions = s.configure(rnd, [0, 1])
        for ins in instructions.values():  # the full global model, never a reward delta
            assert not ins.delta and all(torch.equal(ins.weights[k], before[k]) for k in before)
        s.aggregate(rnd, {c: reply(u) for c, u in ups.items()})
        assert s.pending == {}  # no reward is owed to anyone
    assert not all(torch.equal(before[k], v) for k, v in s.model.state_dict().items())  # the global moved


def test_cffl_global_protocol_aggregates_the_reputable_uploads_into_the_global_model():
    s = tiny_setup(
        CFFL(upload_fraction=1.0, update_clip=None, protocol="global"),
        [200, 100, 100],
        score=lambda m: 0.5 + float(m.head.bias[0].detach()),
    )
    u0 = update([[0.01, 0.0, 0.0], [0.0, 0.0, 0.0]], [0.4, 0.0])
    u1 = update([[0.0, 0.02, 0.0], [0.0, 0.0, 0.0]], [0.1, 0.0])
    u2 = update([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [-0.47, 0.0])
    s.configure(1, [0, 1, 2])
    s.aggregate(1, {0: reply(u0), 1: reply(u1), 2: reply(u2)})
    assert s.reputable == [0, 1]  # client 2's upload scored 0.03: it left R
    torch.testing.assert_close(s.model.head.bias.detach(), 0.5 * u0["head.bias"] + 0.25 * u1["head.bias"])


@pytest.mark.parametrize("method", ["iafl", "cffl", "fedavg"])
def test_reward_evaluation_equals_each_clients_model_evaluated_alone(method, monkeypatch):
    """evaluate_rewards evaluates a reward once per distinct set of weights: IAFL's ten equal models take
    one pass, CFFL's and FedAvg's distinct ones one each, and every accuracy equals that client's reward
    model evaluated alone (the plain loop, an independent computation)."""
    from fedhet.algorithms import fedavg as fedavg_module
    from fedhet.engine.evaluation import accuracy_of

    cfg = small_config(method, train__rounds=2)
    sim = make_simulation(cfg)
    sim.run()
    st = sim.strategy
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(300, 1, 28, 28, generator=gen), torch.randint(0, 10, (300,), generator=gen)
    alone = [accuracy_of(st.reward_model(c), x, y, 128) for c in range(st.info.num_clients)]
    passes = []  # the weight sets handed to the evaluation (one pass each)
    counted = fedavg_module.accuracies_of_states
    monkeypatch.setattr(
        fedavg_module, "accuracies_of_states", lambda m, s, *a: passes.extend(s) or counted(m, s, *a)
    )
    assert st.evaluate_rewards(x, y, 128) == alone  # on CPU one at a time: the same kernels, equal
    distinct = []  # reward_model loads a shared scratch model: copy each client's weights out
    for c in range(st.info.num_clients):
        s = {k: v.clone() for k, v in st.reward_model(c).state_dict().items()}
        if not any(all(torch.equal(s[k], d[k]) for k in s) for d in distinct):
            distinct.append(s)
    assert len(passes) == len(distinct)
    assert (len(distinct) < st.info.num_clients) == (method == "iafl")
