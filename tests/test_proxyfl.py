"""ProxyFL: indecisive sets, ICPL, GPT, the class prior, the strategy's state and end-to-end runs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.algorithms import build_strategy
from fedhet.algorithms.proxyfl import (
    ProxyFL,
    candidate_class_sets,
    global_proxy_tuning,
    gpt_loss,
    icpl_loss,
    indecisive_sets,
    predicted_class_sets,
    proxy_margin,
    update_class_prior,
)
from fedhet.config import ExperimentConfig, load_config
from fedhet.engine import checkpoint as ckpt
from fedhet.engine.protocol import Reply
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from fedhet.models import build_model
from support import aggregate_round

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "proxyfl"


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def tiny_config(method: str = "proxyfl", **params) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split = "fashion-mnist", "labeled-unlabeled"
    cfg.data.split_params = {"labeled_per_class": 20, "alpha": 0.5}
    cfg.data.clients, cfg.data.max_train_samples, cfg.data.max_test_samples = 4, 2000, 300
    cfg.model.name, cfg.model.params = "resnet8", {"width": 4}
    cfg.train.rounds, cfg.train.clients_per_round, cfg.train.local_steps = 3, 2, 2
    cfg.train.batch_size, cfg.train.momentum, cfg.train.weight_decay = 8, 0.9, 1e-4
    cfg.eval.fairness, cfg.eval.rewards, cfg.eval.checkpoint_every = False, False, 1
    cfg.method.name = method
    cfg.method.params = {"gpt_epochs": 3, "threshold": 0.5, **params}
    return cfg


# -- indecisive sets ---------------------------------------------------------------------------------------
def test_indecisive_sets_match_hand_computed_ones():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.15, 0.25, 0.6], [0.34, 0.33, 0.33]])
    prior = torch.tensor([0.4, 0.25, 0.35])
    expected = torch.tensor([[True, True, False], [False, False, True], [False, True, False]])
    assert torch.equal(indecisive_sets(probs, prior), expected)
    assert torch.equal(candidate_class_sets(probs, prior, "prior"), expected)
    top2 = torch.tensor([[True, True, False], [False, True, True], [True, True, False]])
    assert torch.equal(candidate_class_sets(probs, prior, "top-k", top_k=2), top2)
    # A confident sample's predicted set is its top-1 class alone.
    confident = torch.tensor([True, False, True])
    sets = predicted_class_sets(probs, confident, expected)
    assert sets.tolist() == [[True, False, False], [False, False, True], [True, False, False]]
    with pytest.raises(ConfigError, match="indecisive_rule"):
        candidate_class_sets(probs, prior, "top1")


def test_indecisive_sets_compare_in_the_probabilities_dtype():
    # float32(0.1) > 0.1 in float64, but not in float32: the prior is read in the probabilities' precision,
    # so a class whose probability equals the prior (as the client holds it) is not indecisive
    probs = torch.tensor([[0.1, 0.9]], dtype=torch.float32)
    prior = torch.tensor([0.1, 0.5], dtype=torch.float64)
    assert indecisive_sets(probs, prior).tolist() == [[False, True]]


def test_candidate_sets_default_to_the_prior_rule_and_top_5_and_are_boolean():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(6, 10, generator=gen), dim=1)
    prior = torch.full((10,), 0.1)
    assert torch.equal(candidate_class_sets(probs, prior), indecisive_sets(probs, prior))  # rule "prior"
    top = candidate_class_sets(probs, prior, "top-k")
    assert top.dtype == torch.bool and top.sum(dim=1).tolist() == [5] * 6  # k = 5 by default
    ranks = probs.argsort(dim=1, descending=True)
    for row, order in zip(top, ranks, strict=True):
        assert set(row.nonzero().flatten().tolist()) == set(order[:5].tolist())


# -- ICPL --------------------------------------------------------------------------------------------------
def reference_icpl(z, proxies, probs, confident, candidates, num_labeled):
    """Loop-by-loop restatement of methods.md §2.5 (independent of the vectorised implementation)."""
    z = torch.nn.functional.normalize(z, dim=1)
    p = torch.nn.functional.normalize(proxies, dim=1)
    n = z.shape[0]
    sets = []
    for i in range(n):
        if confident[i]:
            sets.append({int(probs[i].argmax())})
        else:
            sets.append({c for c in range(probs.shape[1]) if candidates[i, c]})
    losses = []
    for i in range(num_labeled, n):
        if confident[i]:
            pos = float(z[i] @ p[int(probs[i].argmax())])
        else:
            pooled = sum(float(probs[i, c]) * p[c] for c in range(probs.shape[1]) if candidates[i, c])
            pos = float(z[i] @ pooled) if isinstance(pooled, torch.Tensor) else 0.0
        negs = [float(z[i] @ z[j]) for j in range(n) if j != i and not (sets[i] & sets[j])]
        negs = [s for s in negs if s >= 1e-6]
        logits = [pos, *negs]
        losses.append(-pos + math.log(sum(math.exp(v) for v in logits)))
    return sum(losses) / len(losses)


@pytest.mark.numerics
def test_icpl_equals_a_loop_restatement_of_the_spec():
    gen = torch.Generator().manual_seed(3)
    n, c, d = 9, 4, 5
    z = torch.randn(n, d, generator=gen)
    proxies = torch.randn(c, d, generator=gen)
    probs = torch.softmax(2 * torch.randn(n, c, generator=gen), dim=1)
    prior = torch.full((c,), 0.25)
    confident = probs.max(dim=1).values >= 0.6
    assert 0 < int(confident.sum()) < n  # both kinds of anchors occur
    candidates = indecisive_sets(probs, prior)
    got = float(icpl_loss(z, proxies, probs, confident, candidates, num_labeled=3))
    assert got == pytest.approx(reference_icpl(z, proxies, probs, confident, candidates, 3), rel=1e-5)
    # only rows from num_labeled on are anchors: with all rows as anchors the loss differs
    assert float(icpl_loss(z, proxies, probs, confident, candidates, num_labeled=0)) != pytest.approx(got)


def test_icpl_is_finite_and_reaches_the_classifier_through_the_proxies():
    model = build_model("resnet8", (3, 32, 32), 10, width=4)
    x = torch.rand(12, 3, 32, 32)
    features = model.features(x)
    probs = torch.softmax(3 * torch.randn(12, 10, generator=torch.Generator().manual_seed(0)), dim=1)
    confident = probs.max(dim=1).values > 0.5
    candidates = indecisive_sets(probs, torch.full((10,), 0.1))
    loss = icpl_loss(
        model.feat_proj(features), model.proxy_proj(model.head.weight), probs, confident, candidates, 4
    )
    assert torch.isfinite(loss) and float(loss.detach()) > 0
    loss.backward()
    for name in ("head.weight", "proxy_proj.weight", "feat_proj.weight", "conv1.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and torch.isfinite(grad).all() and float(grad.abs().sum()) > 0, name
    assert model.head.bias.grad is None  # the proxies are the weight rows only


def test_icpl_without_negatives_is_zero():
    # every sample shares class 0 in its set: no negatives, logits = [pos] -> CE = 0
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.7, 0.3]])
    loss = icpl_loss(
        torch.randn(3, 2), torch.randn(2, 2), probs, torch.ones(3, dtype=torch.bool), probs > 0.5, 1
    )
    assert float(loss) == 0.0


def test_icpl_keeps_a_negative_whose_similarity_equals_the_bound():
    """methods.md §2.5: negatives need cosine >= 1e-6, so a similarity of exactly 1e-6 (float32) counts.
    z0 = (1, 0) and z1 = (s, 1)/‖·‖ with s = 1e-6 have z0·z1 = s exactly in float32 (√(1 + s²) rounds to
    1); the two are confident in different classes, so each is the other's only negative. By hand, with
    proxies e0, e1: positives 1, loss = log(1 + e^(s − 1)) for both anchors."""
    s = float(torch.tensor(1e-6, dtype=torch.float32))
    z = torch.tensor([[1.0, 0.0], [1e-6, 1.0]])
    probs = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
    confident = torch.ones(2, dtype=torch.bool)
    loss = icpl_loss(z, torch.eye(2), probs, confident, probs > 0.5, 0)
    assert float(loss) == pytest.approx(math.log(1 + math.exp(s - 1)), rel=1e-6)
    # one unlabeled anchor (row 1): the same value; no unlabeled anchor at all: 0, not the NaN of an empty CE
    loss = icpl_loss(z, torch.eye(2), probs, confident, probs > 0.5, 1)
    assert float(loss) == pytest.approx(math.log(1 + math.exp(s - 1)), rel=1e-6)
    assert float(icpl_loss(z, torch.eye(2), probs, confident, probs > 0.5, 2)) == 0.0


# -- GPT ---------------------------------------------------------------------------------------------------
def test_proxy_margin_known_answer():
    proxies = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0]])
    # nearest-neighbour distances 3, 3, 4 -> the largest is 4, capped by gpt_threshold
    assert proxy_margin(proxies, 100.0) == pytest.approx(4.0)
    assert proxy_margin(proxies, 2.0) == pytest.approx(2.0)
    # two classes: δ is their distance; one-dimensional proxies 0, 1, 3: nearest neighbours 1, 1, 2 -> 2
    assert proxy_margin(torch.tensor([[0.0, 0.0], [3.0, 4.0]]), 100.0) == pytest.approx(5.0)
    assert proxy_margin(torch.tensor([[0.0], [1.0], [3.0]]), 100.0) == pytest.approx(2.0)
    assert proxy_margin(torch.tensor([[1.0, 2.0]]), 7.0) == 7.0  # one class: no neighbour, the cap


@pytest.mark.parametrize("direction", ["paper", "code"])
def test_gpt_loss_known_answer(direction):
    global_proxies = torch.tensor([[0.0], [1.0]])
    local = torch.tensor([[[0.0], [1.0]]])
    assert float(gpt_loss(global_proxies, local, 0.0, direction)) == pytest.approx(math.log(1 + math.exp(-1)))
    assert float(gpt_loss(global_proxies, local, 0.5, direction)) == pytest.approx(
        math.log(1 + math.exp(-0.5))
    )


def outlier_proxies(seed: int = 0) -> torch.Tensor:
    """8 clients' proxies for 5 classes: tight clusters around class centres, client 7 an outlier."""
    gen = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(5, 16, generator=gen)
    local = centres + 0.3 * torch.randn(8, 5, 16, generator=gen)
    local[7] += 6 * torch.randn(5, 16, generator=gen)
    return local


@pytest.mark.parametrize("direction", ["paper", "code"])
def test_gpt_lowers_its_loss_and_moves_global_proxies_to_their_class(direction):
    local = outlier_proxies()
    averaged = local.mean(dim=0)
    result = global_proxy_tuning(
        averaged, local, epochs=30, direction=direction, rng=np.random.default_rng(0)
    )
    assert result.steps == 30 * 10  # 40 proxies in batches of 4
    assert result.loss_after < result.loss_before - 1e-3
    margin = proxy_margin(averaged, 100.0)
    assert result.margin == pytest.approx(margin)
    assert result.loss_before == pytest.approx(float(gpt_loss(averaged, local, margin, direction)))
    before = (averaged.unsqueeze(0) - local).norm(dim=2).sum(dim=0)  # Σ_m ‖ω_G^c − ω_m^c‖ per class
    after = (result.proxies.unsqueeze(0) - local).norm(dim=2).sum(dim=0)
    assert bool((after < before).all()), (before, after)
    # the majority (non-outlier) clients' proxies get closer still
    inliers_before = (averaged.unsqueeze(0) - local[:7]).norm(dim=2).mean()
    inliers_after = (result.proxies.unsqueeze(0) - local[:7]).norm(dim=2).mean()
    assert inliers_after < inliers_before


def test_gpt_is_seeded():
    local = outlier_proxies(1)
    a = global_proxy_tuning(local.mean(0), local, epochs=3, rng=np.random.default_rng(5))
    b = global_proxy_tuning(local.mean(0), local, epochs=3, rng=np.random.default_rng(5))
    assert torch.equal(a.proxies, b.proxies)


# -- the prior -------------------------------------------------------------------------------------------
def test_class_prior_ema_known_answer():
    prior = torch.tensor([0.5, 0.5], dtype=torch.float64)
    new = update_class_prior(prior, torch.tensor([[4.0, 2.0], [2.0, 0.0]]), 0.99)
    # current round: (6, 2) / 8 = (0.75, 0.25)
    assert new.tolist() == pytest.approx([0.99 * 0.5 + 0.01 * 0.75, 0.99 * 0.5 + 0.01 * 0.25])
    assert torch.equal(update_class_prior(prior, torch.zeros(3, 2), 0.99), prior)


# -- the strategy ----------------------------------------------------------------------------------------
def fake_replies(model, num_classes: int, seed: int = 0) -> dict[int, Reply]:
    gen = torch.Generator().manual_seed(seed)
    replies = {}
    for cid in (0, 3):
        weights = {
            k: v + 0.01 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v.clone()
            for k, v in model.state_dict().items()
        }
        counts = torch.zeros(num_classes, dtype=torch.float64)
        counts[cid] = 10.0
        replies[cid] = Reply(
            weights=weights, num_examples=100, metrics={"num_labeled": 10.0}, payload={"class_counts": counts}
        )
    return replies


def test_strategy_sends_the_prior_and_updates_it_from_class_counts(tmp_path):
    sim = make_simulation(tiny_config())
    sim.setup()
    strategy: ProxyFL = sim.strategy
    ins = strategy.configure(1, [0, 1])
    prior = ins[0].payload["proxyfl.prior"]
    assert "proxyfl.prior" not in ins[0].weights  # extra tensors travel beside the model, not in it
    assert prior.tolist() == pytest.approx([0.1] * 10)
    assert ins[0].config["fssl.mask"] == "or" and ins[0].config["fssl.pseudo_labels"] == "global"
    replies = fake_replies(strategy.model, 10)
    averaged_head = torch.stack([r.weights["head.weight"] for r in replies.values()]).mean(0)
    averaged_bias = torch.stack([r.weights["head.bias"] for r in replies.values()]).mean(0)
    aggregate_round(strategy, 1, replies)
    expected = [0.99 * 0.1 + 0.01 * (0.5 if k in (0, 3) else 0.0) for k in range(10)]
    assert strategy.prior.tolist() == pytest.approx(expected)
    assert not torch.allclose(strategy.model.head.weight, averaged_head)  # GPT changed the proxies
    assert torch.allclose(strategy.model.head.bias, averaged_bias)  # the bias keeps its FedAvg value
    metrics = strategy.round_metrics(1)
    assert metrics["global_prior"] == pytest.approx(expected)
    assert metrics["gpt_loss_after"] < metrics["gpt_loss_before"]
    # next round sends the updated prior
    assert strategy.configure(2, [1])[1].payload["proxyfl.prior"].tolist() == pytest.approx(expected)


def test_inflated_labeled_weights_quirk():
    replies = {0: Reply({}, 110, {"num_labeled": 10.0}), 1: Reply({}, 300, {"num_labeled": 50.0})}
    plain = build_strategy("proxyfl", {}).aggregation_weights(1, replies)
    assert plain.tolist() == [110.0, 300.0]  # |L_i| + |U_i|
    quirk = build_strategy("proxyfl", {"inflated_labeled_weights": True}).aggregation_weights(1, replies)
    assert quirk.tolist() == [2000 * 10 + 100, 2000 * 50 + 250]


def test_state_dict_round_trips_through_a_checkpoint(tmp_path):
    sim = make_simulation(tiny_config())
    sim.setup()
    strategy = sim.strategy
    aggregate_round(strategy, 1, fake_replies(strategy.model, 10))
    aggregate_round(strategy, 2, fake_replies(strategy.model, 10, seed=1))
    ckpt.save_checkpoint(tmp_path / "ck", {"strategy": strategy.state_dict()})
    other = make_simulation(tiny_config())
    other.setup()
    other.strategy.load_state_dict(ckpt.load_checkpoint(tmp_path / "ck")["strategy"])
    assert torch.equal(other.strategy.prior, strategy.prior)
    for k, v in strategy.model.state_dict().items():
        assert torch.equal(other.strategy.model.state_dict()[k], v)


def test_invalid_options_are_config_errors():
    with pytest.raises(ConfigError, match="gpt_direction"):
        build_strategy("proxyfl", {"gpt_direction": "sideways"})
    with pytest.raises(ConfigError, match="threshold"):
        build_strategy("proxyfl", {"threshold": 1.5})
    with pytest.raises(ConfigError, match="prior_momentum"):
        build_strategy("proxyfl", {"prior_momentum": 2})
    cfg = tiny_config()
    cfg.model.name, cfg.model.params = "mlp", {}
    with pytest.raises(ConfigError, match="feat_proj"):
        make_simulation(cfg).setup()


# -- end to end --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"gpt_direction": "code", "shared_optimizer": True, "inflated_labeled_weights": True},
        {"icpl": False, "indecisive_rule": "top-k", "indecisive_top_k": 2},
    ],
)
def test_proxyfl_runs_end_to_end_and_writes_its_reports(tmp_path, params):
    cfg = tiny_config(**params)
    summary = make_simulation(cfg, run_dir=tmp_path / "run").run()
    assert 0.0 <= summary["final"]["accuracy"] <= 1.0
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3
    for line in lines:
        assert len(line["global_prior"]) == 10 and sum(line["global_prior"]) == pytest.approx(1.0)
        assert 0.0 <= line["unlabeled_used_fraction"] <= 1.0
        assert 0.0 <= line["pseudo_label_accuracy"] <= 1.0
        assert math.isfinite(line["loss_supervised"])
        assert ("loss_icpl" in line) == params.get("icpl", True)
    for name in (
        "global_prior.csv",
        "fssl_rounds.csv",
        "figures/global_prior.png",
        "figures/pseudo_labels.png",
    ):
        assert (tmp_path / "run" / name).is_file(), name
    prior_rows = (tmp_path / "run" / "global_prior.csv").read_text().splitlines()
    assert len(prior_rows) == 1 + 1 + 3  # header, round 0 (uniform), rounds 1-3
    # a column per class, named as Fashion-MNIST names its classes (written out here, not read from fedhet)
    fashion = "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
    assert prior_rows[0] == f"round,{fashion}"


def test_global_prior_columns_are_numbered_where_the_data_name_no_classes(tmp_path):
    from fedhet.engine.names import RunNames
    from fedhet.report.artifacts import write_fssl

    lines = [{"round": 1, "global_prior": [0.25, 0.75]}]
    write_fssl(tmp_path, {"method": "proxyfl"}, lines, RunNames())
    rows = (tmp_path / "global_prior.csv").read_text().splitlines()
    assert rows == ["round,class_0,class_1", "0,0.5,0.5", "1,0.25,0.75"]
    write_fssl(tmp_path, {"method": "proxyfl"}, lines, RunNames(classes=("benign", "malignant")))
    assert (tmp_path / "global_prior.csv").read_text().splitlines()[0] == "round,benign,malignant"


def test_normalization_mismatch_needs_rgb_data():
    cfg = tiny_config(normalization_mismatch=True)
    with pytest.raises(ConfigError, match="normalization_mismatch"):
        make_simulation(cfg).run()


@pytest.mark.slow
def test_interrupted_proxyfl_run_resumes_with_identical_results(tmp_path):
    cfg = tiny_config()
    make_simulation(cfg, run_dir=tmp_path / "full").run()

    class Stop(Exception):
        pass

    def stop_at_2(rnd, total, line):
        if rnd == 2:
            raise Stop

    with pytest.raises(Stop):
        make_simulation(cfg, run_dir=tmp_path / "cut", progress=stop_at_2).run()
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "round_00002")
    make_simulation(cfg, run_dir=tmp_path / "cut", resume=True).run()
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == (
        tmp_path / "full" / "metrics.jsonl"
    ).read_text()
    assert (tmp_path / "cut" / "global_prior.csv").read_text() == (
        tmp_path / "full" / "global_prior.csv"
    ).read_text()


# -- configs ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_config_files_parse_and_build_their_strategy(path):
    cfg = load_config(path)
    assert cfg.data.split == "labeled-unlabeled"
    build_strategy(cfg.method.name, cfg.method.params)


# -- the paper's and the code's GPT differ; the strategy runs Q epochs -------------------------------------
def test_gpt_loss_asymmetric_case_tells_the_directions_apart():
    """One client, two classes, 1-D proxies: Ω_G = (0, 2), ω = (1, 0). The code compares each local proxy with
    every global one, the paper each global proxy with the client's local ones; worked out by hand."""
    global_proxies = torch.tensor([[0.0], [2.0]])
    local = torch.tensor([[[1.0], [0.0]]])
    ce = lambda d, c: d[c] + math.log(sum(math.exp(-v) for v in d))  # noqa: E731  CE(−D, c)
    code = (ce([1, 1], 0) + ce([0, 2], 1)) / 2  # D_c = (|1 − 0|, |1 − 2|), (|0 − 0|, |0 − 2|)
    paper = (ce([1, 0], 0) + ce([1, 2], 1)) / 2  # D_c = (|0 − 1|, |0 − 0|), (|2 − 1|, |2 − 0|)
    assert abs(code - paper) > 0.05
    assert float(gpt_loss(global_proxies, local, 0.0, "code")) == pytest.approx(code)
    assert float(gpt_loss(global_proxies, local, 0.0, "paper")) == pytest.approx(paper)
    margin = (ce([1.5, 1], 0) + ce([0, 2.5], 1)) / 2  # δ = 0.5 on the true class
    assert float(gpt_loss(global_proxies, local, 0.5, "code")) == pytest.approx(margin)


def test_the_paper_direction_has_no_margin_unless_asked():
    assert build_strategy("proxyfl", {}).gpt_margin is False
    assert build_strategy("proxyfl", {"gpt_direction": "code"}).gpt_margin is True
    assert build_strategy("proxyfl", {"gpt_margin": True}).gpt_margin is True
    local = outlier_proxies()
    tuned = global_proxy_tuning(
        local.mean(0), local, epochs=2, use_margin=False, rng=np.random.default_rng(0)
    )
    assert tuned.margin == 0.0
    assert tuned.loss_before == pytest.approx(float(gpt_loss(local.mean(0), local, 0.0, "paper")))


def test_the_strategy_runs_gpt_for_gpt_epochs_over_the_uploaded_proxies():
    sim = make_simulation(tiny_config(gpt_epochs=3, gpt_batch_size=4))
    sim.setup()
    strategy = sim.strategy
    aggregate_round(strategy, 1, fake_replies(strategy.model, 10))
    # 2 clients × 10 classes = 20 proxies in batches of 4 -> 5 steps per epoch, Q = 3 epochs
    assert strategy.round_metrics(1)["gpt_steps"] == 3 * 5


# -- one local step with a stub teacher: class counts and ICPL's inputs ----------------------------------
def capture_icpl_inputs(monkeypatch) -> dict:
    """Record what the trainer hands ICPL (probs, confident, candidates, num_labeled); the loss still runs."""
    import fedhet.algorithms.proxyfl as proxyfl_module

    seen: dict = {}
    real = proxyfl_module.icpl_loss

    def capture(embeddings, proxies, probs, confident, candidates, num_labeled):
        seen.update(probs=probs, confident=confident, candidates=candidates, num_labeled=num_labeled)
        return real(embeddings, proxies, probs, confident, candidates, num_labeled)

    monkeypatch.setattr(proxyfl_module, "icpl_loss", capture)
    return seen


class StubTeacher(torch.nn.Module):
    """A frozen 'global model' whose probabilities the test computes itself: logits_j = 40·x̄·(j − 4.5), so
    the confidence varies with the image's mean."""

    def forward(self, x):
        return 40.0 * x.flatten(1).mean(1, keepdim=True) * (torch.arange(10.0) - 4.5)


def test_one_proxyfl_step_counts_classes_and_feeds_icpl_the_global_models_view(monkeypatch):
    from fedhet.algorithms.fssl import SemiSupervisedBatch
    from support import prepared_update

    sim = make_simulation(tiny_config(threshold=0.5))
    sim.setup()
    ins = sim.strategy.configure(1, [0])[0]
    prior = torch.tensor([0.05, 0.05, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
    ins.payload["proxyfl.prior"] = prior
    trainer = sim.trainer
    u = prepared_update(trainer, sim.work_model, sim.fed.clients[0], ins, sim.cfg.train)
    u.scratch.teacher = StubTeacher()
    gen = torch.Generator().manual_seed(3)
    x, weak = torch.randn(4, 1, 28, 28, generator=gen), torch.randn(6, 1, 28, 28, generator=gen)
    labels = torch.tensor([1, 1, 7, 2])
    batch = SemiSupervisedBatch(
        labeled=x,
        labels=labels,
        weak=weak,
        strong=weak + 0.1,
        unlabeled_truth=torch.zeros(6, dtype=torch.long),
        last_epoch=True,
    )
    seen = capture_icpl_inputs(monkeypatch)
    trainer.loss(u, batch)
    teacher = StubTeacher()
    p_x, p_u = torch.softmax(teacher(x), 1), torch.softmax(teacher(weak), 1)
    # q = [p_x^G; p_u^G; p_u^G] (the global model's view of the labeled rows, not their labels)
    torch.testing.assert_close(seen["probs"], torch.cat([p_x, p_u, p_u]))
    # ξ = {c : q(c) > π(c)} with the server's prior, not the top-1 class
    torch.testing.assert_close(seen["candidates"], torch.cat([p_x, p_u, p_u]) > prior)
    m_local = torch.softmax(sim.work_model.eval()(weak), 1).max(1).values >= 0.5
    mask = (p_u.max(1).values >= 0.5) | m_local
    torch.testing.assert_close(seen["confident"], torch.cat([p_x.max(1).values >= 0.5, mask, mask]))
    assert seen["num_labeled"] == 4
    # class counts: the labeled labels, plus the global pseudo-labels of the unlabeled samples that pass
    expected = torch.bincount(labels, minlength=10).double()
    expected += torch.bincount(p_u.argmax(1)[mask], minlength=10).double()
    torch.testing.assert_close(u.scratch.class_counts, expected)
    assert bool(mask.any()) and not bool(mask.all())  # the case exercises both branches


# -- clients without labels (split param labeled_clients) ------------------------------------------------
def test_a_client_without_labels_learns_from_pseudo_labels_only(monkeypatch):
    """Client 0 holds no labels: its batches have no labeled rows, it has no supervised loss, ICPL has no
    labeled rows, and its class counts are the global pseudo-labels that pass the mask, nothing else."""
    from support import prepared_update

    cfg = tiny_config(threshold=0.99)  # the stub's confidences on these images: 0.71 to 1.0
    cfg.data.split_params = {**cfg.data.split_params, "labeled_clients": [1, 3]}
    sim = make_simulation(cfg)
    sim.setup()
    data = sim.fed.clients[0]
    assert data.num_examples == 0 and data.unlabeled_indices.numel() > 100
    ins = sim.strategy.configure(1, [0])[0]
    ins.payload["proxyfl.prior"] = torch.full((10,), 0.1)
    trainer = sim.trainer
    u = prepared_update(trainer, sim.work_model, data, ins, sim.cfg.train)
    u.scratch.teacher = StubTeacher()
    batch = next(iter(trainer.batches(u)))
    assert batch.labeled.shape[0] == 0 and batch.weak.shape[0] == 2 * cfg.train.batch_size
    batch.last_epoch = True
    seen = capture_icpl_inputs(monkeypatch)
    trainer.loss(u, batch)
    p_u = torch.softmax(StubTeacher()(batch.weak), 1)
    assert seen["num_labeled"] == 0
    torch.testing.assert_close(seen["probs"], torch.cat([p_u, p_u]))
    m_local = torch.softmax(sim.work_model.eval()(batch.weak), 1).max(1).values >= 0.99
    mask = (p_u.max(1).values >= 0.99) | m_local
    assert bool(mask.any()) and not bool(mask.all())
    torch.testing.assert_close(
        u.scratch.class_counts, torch.bincount(p_u.argmax(1)[mask], minlength=10).double()
    )
    stats = u.scratch.stats
    assert "loss_supervised" not in stats and "loss_unlabeled" in stats and "loss_icpl" in stats


@pytest.mark.parametrize("method", ["proxyfl", "fixmatch-gpl", "sage", "fedavg-labeled"])
def test_labels_at_one_client_train_every_fssl_method(tmp_path, method):
    """With labels at client 2 only, every method runs; the labeled-only baseline gives the clients without
    labels weight 0 (they have nothing to learn from), the FSSL methods weigh them by their unlabeled data."""
    cfg = tiny_config(method)
    cfg.method.params = {} if method == "fedavg-labeled" else {"threshold": 0.5}
    cfg.data.split_params = {**cfg.data.split_params, "labeled_clients": [2]}
    cfg.train.clients_per_round = 1.0
    cfg.train.rounds, cfg.eval.checkpoint_every = 2, 0
    out = make_simulation(cfg, run_dir=tmp_path / method).run()
    assert math.isfinite(out["final"]["accuracy"])
    lines = [json.loads(s) for s in (tmp_path / method / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        weights = line["aggregation_weights"]
        if method == "fedavg-labeled":
            assert weights == {"0": 0.0, "1": 0.0, "2": 1.0, "3": 0.0}
        else:  # n_i = |L_i| + |U_i|: clients without labels still weigh by their unlabeled data
            assert all(w > 0 for w in weights.values())


# -- tests for the mutants a mutation run left alive (tools/mutation.py) --------------------------------
def test_gpt_steps_replayed_by_hand():
    """Two epochs of GPT with batches of 3 over M·C = 6 pairs, replayed step by step from the same
    permutations: plain SGD at the given lr on each batch's loss, δ from the averaged proxies, the 'code'
    direction; local proxies may come in float64 (cast to the global proxies' dtype)."""
    gen = torch.Generator().manual_seed(5)
    global_proxies = torch.randn(3, 4, generator=gen)
    local = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)
    result = global_proxy_tuning(
        global_proxies, local, epochs=2, batch_size=3, lr=0.3, direction="code", rng=np.random.default_rng(7)
    )
    rng = np.random.default_rng(7)
    margin = proxy_margin(global_proxies, 100.0)
    w = global_proxies.clone()
    local32 = local.float()
    for _ in range(2):
        order = torch.as_tensor(rng.permutation(6))
        for start in (0, 3):
            w = w.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(gpt_loss(w, local32, margin, "code", order[start : start + 3]), w)
            w = w - 0.3 * g
    assert result.steps == 4 and result.margin == pytest.approx(margin)
    torch.testing.assert_close(result.proxies, w.detach(), rtol=1e-6, atol=1e-6)
    assert result.loss_after == pytest.approx(float(gpt_loss(w.detach(), local32, margin, "code")), rel=1e-6)
    assert result.loss_before == pytest.approx(float(gpt_loss(global_proxies, local32, margin, "code")))


def test_gpt_defaults_are_the_papers():
    """Q = 100 epochs, batches of 4, δ capped at 100 (methods.md §2.6); the loss's default direction is the
    paper's; the margin enters in float64 when the distances are float64."""
    far = torch.tensor([[0.0, 0.0], [500.0, 0.0]])  # nearest-neighbour distance 500 > the cap
    local = far.unsqueeze(0).repeat(3, 1, 1)
    result = global_proxy_tuning(far, local, rng=np.random.default_rng(0))
    assert result.steps == 100 * math.ceil(3 * 2 / 4) and result.margin == 100.0
    gen = torch.Generator().manual_seed(1)
    g, loc = torch.randn(3, 2, generator=gen), torch.randn(2, 3, 2, generator=gen)
    assert float(gpt_loss(g, loc, 0.5)) == float(gpt_loss(g, loc, 0.5, "paper"))
    assert float(gpt_loss(g, loc, 0.5)) != pytest.approx(float(gpt_loss(g, loc, 0.5, "code")))
    g64, loc64, margin = g.double(), loc.double(), 1.0 / 3.0
    dist = torch.cdist(loc64.reshape(6, 2), g64)  # code direction, by hand in float64
    cls = torch.arange(6) % 3
    dist = dist + margin * torch.nn.functional.one_hot(cls, 3).double()
    expected = torch.nn.functional.cross_entropy(-dist, cls)
    assert float(gpt_loss(g64, loc64, margin, "code")) == pytest.approx(float(expected), rel=1e-13, abs=0)


def test_class_prior_defaults_to_momentum_099_and_counts_a_single_sample():
    prior = torch.full((4,), 0.25, dtype=torch.float64)
    one = torch.tensor([0.0, 1.0, 0.0, 0.0])  # one counted sample: Σ counts = 1 still moves the prior
    expected = [0.99 * 0.25 + 0.01 * v for v in (0.0, 1.0, 0.0, 0.0)]
    assert update_class_prior(prior, one).tolist() == pytest.approx(expected)


def test_invalid_class_counts_are_left_out_of_the_prior(caplog):
    sim = make_simulation(tiny_config())
    sim.setup()
    strategy: ProxyFL = sim.strategy
    before = strategy.prior.clone()
    replies = fake_replies(strategy.model, 10)
    replies[0].payload["class_counts"] = torch.full((10,), -1.0)  # negative (finite, right shape)
    replies[3].payload["class_counts"] = torch.ones(9)  # wrong shape (finite, non-negative)
    with caplog.at_level("WARNING", logger="fedhet"):
        aggregate_round(strategy, 1, replies)
    assert torch.equal(strategy.prior, before)  # nothing valid: the prior stays
    assert sum("sent no valid class_counts" in r.message for r in caplog.records) == 2
    replies = fake_replies(strategy.model, 10)
    replies[3].payload["class_counts"] = torch.full((10,), float("nan"))
    aggregate_round(strategy, 2, replies)
    expected = 0.99 * before + 0.01 * torch.nn.functional.one_hot(torch.tensor(0), 10).double()
    torch.testing.assert_close(strategy.prior, expected)  # only client 0's counts (class 0)


def test_icpl_reads_top_k_from_the_config_and_the_labeled_rows_confidence_at_the_threshold(monkeypatch):
    """A labeled image of zeros gets the stub teacher's uniform 0.1: confident at τ = 0.1 (≥, not >);
    indecisive_top_k = 2 reaches the candidate sets."""
    from fedhet.algorithms.fssl import SemiSupervisedBatch
    from support import prepared_update

    sim = make_simulation(tiny_config(threshold=0.1, indecisive_rule="top-k", indecisive_top_k=2))
    sim.setup()
    ins = sim.strategy.configure(1, [0])[0]
    u = prepared_update(sim.trainer, sim.work_model, sim.fed.clients[0], ins, sim.cfg.train)
    u.scratch.teacher = StubTeacher()
    weak = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    batch = SemiSupervisedBatch(
        labeled=torch.zeros(1, 1, 28, 28),
        labels=torch.tensor([3]),
        weak=weak,
        strong=weak,
        unlabeled_truth=torch.zeros(2, dtype=torch.long),
        last_epoch=False,
    )
    seen = capture_icpl_inputs(monkeypatch)
    sim.trainer.loss(u, batch)
    assert bool(seen["confident"][0])  # max p = 0.1 exactly, τ = 0.1
    assert seen["candidates"].sum(dim=1).tolist() == [2] * 5
