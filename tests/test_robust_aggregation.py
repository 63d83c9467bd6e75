"""Robust aggregation rules against hand calculations (numbers small enough to check on paper)."""

from __future__ import annotations

import pytest
import torch

from fedhet.algorithms.robust_aggregation import (
    aggregate_vectors,
    centered_clipping,
    coordinate_median,
    krum_scores,
    multi_krum,
    trimmed_mean,
)
from support import aggregating_strategy

X = torch.tensor([[1.0, 10.0], [5.0, 20.0], [2.0, 30.0], [100.0, -40.0]])


def test_the_median_is_the_middle_value_per_coordinate():
    # column 0 sorted (1, 2, 5, 100): (2 + 5) / 2 = 3.5; column 1 sorted (-40, 10, 20, 30): 15
    assert coordinate_median(X).tolist() == [3.5, 15.0]
    assert coordinate_median(X[:3]).tolist() == [2.0, 20.0]  # odd count: the middle one


def test_the_trimmed_mean_cuts_floor_beta_n_from_each_end():
    # beta 0.25 of 4: cut 1 each end; column 0 keeps (2, 5) -> 3.5, column 1 keeps (10, 20) -> 15
    assert trimmed_mean(X, 0.25).tolist() == [3.5, 15.0]
    assert trimmed_mean(X, 0.2).tolist() == pytest.approx([27.0, 5.0])  # ⌊0.8⌋ = 0: the plain mean
    with pytest.raises(ValueError, match="beta=0.5 leaves no value"):
        trimmed_mean(X, 0.5)


def test_krum_scores_sum_the_squared_distances_to_the_nearest_n_minus_f_minus_2():
    points = torch.tensor([[0.0], [1.0], [3.0], [100.0]])
    # f = 0: the 2 nearest others. 0: 1 + 9 = 10; 1: 1 + 4 = 5; 3: 4 + 9 = 13; 100: 97² + 99² = 19210
    assert krum_scores(points, 0).tolist() == [10.0, 5.0, 13.0, 19210.0]
    # f = 1: the 1 nearest. 0: 1; 1: 1; 3: 4; 100: 97² = 9409
    assert krum_scores(points, 1).tolist() == [1.0, 1.0, 4.0, 9409.0]
    out, kept = multi_krum(points, torch.ones(4), 0, 1)  # Krum: the lowest score, x = 1
    assert out.tolist() == [1.0] and kept.tolist() == [1]
    out, kept = multi_krum(points, torch.tensor([1.0, 3.0, 1.0, 1.0]), 0, 2)  # rows 1 and 0, weights 3:1
    assert kept.tolist() == [0, 1] and out.tolist() == pytest.approx([0.75])


def test_centered_clipping_moves_the_center_by_the_mean_of_clipped_deviations():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.5]])
    # from 0 with τ = 1: (3, 4) has norm 5 -> (0.6, 0.8); (0, 0.5) stays; mean (0.3, 0.65)
    once = centered_clipping(x, torch.ones(2), torch.zeros(2), tau=1.0)
    assert once.tolist() == pytest.approx([0.3, 0.65])
    # a second iteration from (0.3, 0.65): (2.7, 3.35) clipped to norm 1, (-0.3, -0.15) kept
    z = torch.tensor([2.7, 3.35])
    expected = torch.tensor([0.3, 0.65]) + (z / z.norm() + torch.tensor([-0.3, -0.15])) / 2
    assert centered_clipping(x, torch.ones(2), torch.zeros(2), 1.0, 2).tolist() == pytest.approx(
        expected.tolist()
    )


def test_one_hostile_row_moves_the_mean_but_not_the_robust_rules():
    honest = torch.tensor([[1.0, 1.0], [1.2, 0.8], [0.9, 1.1], [1.1, 0.9], [0.8, 1.2]])
    x = torch.cat([honest, torch.tensor([[1000.0, -1000.0]])])
    p = torch.ones(6)
    mean, _ = aggregate_vectors(x, p, "mean")
    assert mean[0] > 100
    for rule, kwargs in [
        ("median", {}),
        ("trimmed-mean", {"beta": 0.2}),
        ("krum", {"num_malicious_nodes": 1}),
        ("multi-krum", {"num_malicious_nodes": 1, "num_nodes_to_select": 4}),
        ("centered-clipping", {"center": torch.ones(2), "clipping_tau": 0.5}),
    ]:
        out, used = aggregate_vectors(x, p, rule, **kwargs)
        assert (out - torch.ones(2)).abs().max() < 0.25, rule
        if rule in ("krum", "multi-krum"):
            assert 5 not in used
    with pytest.raises(ValueError, match="unknown aggregation rule 'mode'"):
        aggregate_vectors(x, p, "mode")


# --------------------------------------------------------------------------------------------------------
# [aggregation]: the rules inside the methods that average client models
# --------------------------------------------------------------------------------------------------------
def _strategy(method: str, settings: dict, n: int = 5):
    return aggregating_strategy(settings, n, method)


def _replies(strategy, n: int = 5, hostile: float | None = None):
    from fedhet.engine.protocol import Reply

    gen = torch.Generator().manual_seed(1)
    start = strategy.model.state_dict()
    replies = {}
    for cid in range(n):
        w = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in start.items()}
        if hostile is not None and cid == n - 1:
            w = {k: start[k] + hostile * (v - start[k]) for k, v in w.items()}
        replies[cid] = Reply(weights=w, num_examples=10 * (cid + 1))
    return replies


def test_median_rule_inside_fedavg_is_numpys_coordinate_median_of_the_client_models():
    import numpy as np

    strategy = _strategy("fedavg", {"rule": "median"})
    replies = _replies(strategy, hostile=100.0)
    strategy.aggregate(1, replies)
    for key, value in strategy.model.state_dict().items():
        expected = np.median(np.stack([replies[c].weights[key].numpy() for c in range(5)]), axis=0)
        assert np.allclose(value.numpy(), expected, atol=1e-7), key
    assert strategy.round_weights == {c: 0.2 for c in range(5)}  # unweighted: 1/n each


def test_multi_krum_drops_the_scaled_client_and_keeps_the_methods_weights_among_the_rest():
    strategy = _strategy("fedavg", {"rule": "multi-krum", "num_malicious_nodes": 1, "num_nodes_to_select": 3})
    replies = _replies(strategy, hostile=100.0)
    strategy.aggregate(1, replies)
    shares = strategy.round_weights
    assert shares[4] == 0.0 and sum(v > 0 for v in shares.values()) == 3
    kept = [c for c, v in shares.items() if v > 0]
    sizes = {c: 10 * (c + 1) for c in kept}  # FedAvg's weights: the sample counts, renormalised over the kept
    for c in kept:
        assert shares[c] == pytest.approx(sizes[c] / sum(sizes.values()))
    for key, value in strategy.model.state_dict().items():
        expected = sum(shares[c] * replies[c].weights[key] for c in kept)
        assert torch.allclose(value, expected, atol=1e-6), key


def test_the_default_rule_is_the_weighted_mean_bit_for_bit():
    from fedhet.algorithms.fedavg import weighted_average

    strategy = _strategy("fedavg", {"rule": "mean"})
    replies = _replies(strategy)
    strategy.aggregate(1, replies)
    expected = weighted_average([replies[c].weights for c in range(5)], [10 * (c + 1) for c in range(5)])
    assert all(torch.equal(strategy.model.state_dict()[k], expected[k]) for k in expected)  # one code path


def test_a_robust_rule_keeps_a_scaled_client_from_capturing_fedavg_end_to_end():
    import fedhet

    base = {"data": {"dataset": "digits", "clients": 6, "split": "iid"},
            "train": {"rounds": 8, "lr": 0.1, "batch_size": 32},
            "faults": {"clients": {"5": "scale"}},
            "guards": {"update_norm_factor": 0, "update_norm_clip": 0}}  # fmt: skip
    clean = fedhet.run({**base, "faults": {}}).accuracy
    attacked = fedhet.run(base).accuracy
    defended = fedhet.run({**base, "aggregation": {"rule": "median"}}).accuracy
    # measured: clean 0.81, x100 with the guard off 0.10 (chance), the median 0.86
    assert attacked < clean - 0.3
    assert defended > clean - 0.1


def test_the_own_model_methods_apply_the_rule_inside_their_own_weighted_sums():
    """CGSV, CFFL, IAFL, ShapFed: Σ w_i·u_i becomes (Σ w_i) · rule(u; w) (the rule replaces the mean)."""
    import numpy as np

    strategy = _strategy("iafl", {"rule": "median"})
    gen = torch.Generator().manual_seed(3)
    updates = [{k: torch.randn(v.shape, generator=gen) for k, v in strategy.model.state_dict().items()}]
    updates += [{k: torch.randn(v.shape, generator=gen) for k, v in updates[0].items()} for _ in range(4)]
    weights = [0.1, 0.1, 0.2, 0.05, 0.05]  # sum 0.5: the method's own total is kept
    out = strategy.combine(updates, weights)
    for key in strategy.float_keys:
        expected = 0.5 * np.median(np.stack([u[key].numpy() for u in updates]), axis=0)
        assert np.allclose(out[key].numpy(), expected, atol=1e-6), key
    from fedhet.algorithms.own_model import weighted_sum

    mean = _strategy("iafl", {"rule": "mean"}).combine(updates, weights)
    before = weighted_sum(updates, weights, strategy.float_keys)  # the method's own sum: the same code path
    assert all(torch.equal(mean[key], before[key]) for key in strategy.float_keys)


def test_shapfed_with_the_median_is_not_captured_by_a_noise_client():
    import fedhet

    base = {"data": {"dataset": "digits", "clients": 6, "split": "iid"},
            "train": {"rounds": 6, "lr": 0.1, "batch_size": 32}, "method": {"name": "shapfed"},
            "faults": {"clients": {"5": "noise"}}, "guards": {"update_norm_factor": 0, "update_norm_clip": 0},
            "eval": {"fairness": False}}  # fmt: skip
    captured = fedhet.run(base)
    defended = fedhet.run({**base, "aggregation": {"rule": "median"}})
    # measured: the noise client takes most of ShapFed's weight and the model falls to chance; the median
    # keeps the model learning
    assert defended.accuracy > captured.accuracy + 0.3


def test_methods_that_do_not_average_models_refuse_a_robust_rule_by_name():
    import fedhet
    from fedhet.errors import ConfigError

    with pytest.raises(ConfigError, match="method 'fedrac' does not compute"):
        fedhet.run({"data": {"dataset": "digits", "clients": 3, "validation_fraction": 0.1},
                    "model": {"name": "mlp200", "params": {"hidden_size": 16}}, "train": {"rounds": 1},
                    "method": {"name": "fedrac", "params": {"candidate_step": 4, "candidate_step_late": 4}},
                    "aggregation": {"rule": "median"}, "eval": {"fairness": False}})  # fmt: skip
    with pytest.raises(ConfigError, match="aggregation.beta=0.5 must be in"):
        fedhet.run({"data": {"dataset": "digits", "clients": 3},
                    "aggregation": {"rule": "trimmed-mean", "beta": 0.5}})  # fmt: skip


# --------------------------------------------------------------------------------------------------------
# The direction guard: cos(update, the round's coordinate-wise median update)
# --------------------------------------------------------------------------------------------------------
def test_update_cosines_against_numpy():
    import numpy as np

    from fedhet.engine.guards import update_cosines
    from fedhet.engine.protocol import Instruction, Reply

    gen = np.random.default_rng(0)
    sent = {"a": torch.zeros(3), "b": torch.ones(2, 2)}
    deltas = [gen.normal(size=7) for _ in range(4)]
    replies = {}
    for cid, d in enumerate(deltas):
        weights = {"a": sent["a"] + torch.tensor(d[:3]), "b": sent["b"] + torch.tensor(d[3:]).view(2, 2)}
        replies[cid] = Reply(weights=weights, num_examples=1)
    outgoing = {cid: Instruction(weights=sent) for cid in replies}
    got = update_cosines(replies, outgoing)
    stacked = np.stack(deltas)
    median = np.sort(stacked, axis=0)[1]  # the lower of the two middle values (torch's median for 4)
    for cid, d in enumerate(deltas):
        expected = d @ median / (np.linalg.norm(d) * np.linalg.norm(median))
        assert got[cid] == pytest.approx(expected, abs=1e-5)
    assert update_cosines(dict(list(replies.items())[:2]), outgoing) == {}  # no consensus of two


def test_the_direction_guard_rejects_sign_flip_and_ipm_and_spares_the_honest():
    import fedhet

    cfg = {"data": {"dataset": "digits", "clients": 6, "split": "iid"},
           "train": {"rounds": 3, "lr": 0.1, "batch_size": 32},
           "faults": {"clients": {"4": "ipm", "5": "sign-flip"}}}  # fmt: skip
    guarded = fedhet.run({**cfg, "guards": {"min_update_cosine": -0.5}})
    for line in guarded.metrics:
        assert sorted(line["rejected"]) == ["4", "5"]
        assert "guards.min_update_cosine" in line["rejected"]["5"]
        honest = [v for c, v in line["update_cosines"].items() if c not in ("4", "5")]
        assert min(honest) > 0.3  # measured 0.53..0.75 on this IID split
    unguarded = fedhet.run(cfg)  # off by default: nothing is rejected, nothing measured
    assert all("rejected" not in line and "update_cosines" not in line for line in unguarded.metrics)


# --------------------------------------------------------------------------------------------------------
# The anchor: Flower's own aggregation functions (FedMedian, FedTrimmedAvg, (Multi)Krum) on the same replies
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings",
    [
        {"rule": "median"},
        {"rule": "trimmed-mean", "beta": 0.25},
        {"rule": "krum", "num_malicious_nodes": 2},
        {"rule": "multi-krum", "num_malicious_nodes": 1, "num_nodes_to_select": 4},
    ],
)
def test_each_rule_matches_flowers_implementation_on_the_same_replies(settings):
    aggregate = pytest.importorskip("flwr.server.strategy.aggregate")
    import numpy as np

    from fedhet.algorithms.robust_aggregation import robust_average

    gen = np.random.default_rng(7)
    shapes = {"w": (4, 3), "b": (4,)}
    models = [{k: gen.normal(size=s) * (1 + 30 * (i == 5)) for k, s in shapes.items()} for i in range(8)]
    sizes = [int(n) for n in gen.integers(5, 50, size=8)]
    results = [([m["w"], m["b"]], n) for m, n in zip(models, sizes, strict=True)]
    rule = settings["rule"]
    if rule == "median":
        expected = aggregate.aggregate_median(results)
    elif rule == "trimmed-mean":
        expected = aggregate.aggregate_trimmed_avg(results, settings["beta"])
    else:
        keep = 0 if rule == "krum" else settings["num_nodes_to_select"]
        expected = aggregate.aggregate_krum(results, settings["num_malicious_nodes"], keep)
    states = [{k: torch.tensor(v, dtype=torch.float64) for k, v in m.items()} for m in models]
    got, _ = robust_average(states, sizes, settings)
    # float64 on both sides; the two sum in different orders, so equal to rounding, not bit for bit
    assert np.allclose(got["w"].numpy(), expected[0], rtol=1e-12, atol=1e-12)
    assert np.allclose(got["b"].numpy(), expected[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "settings",
    [
        {"rule": "mean"},
        {"rule": "median"},
        {"rule": "trimmed-mean", "beta": 0.2},
        {"rule": "krum", "num_malicious_nodes": 1},
        {"rule": "multi-krum", "num_malicious_nodes": 1, "num_nodes_to_select": 3},
    ],
)
def test_implementation_flower_is_flowers_strategy_inside_fedavg(settings, monkeypatch):
    """``implementation = "flower"`` hands the rule to Flower's own strategy (FedAvg, FedMedian,
    FedTrimmedAvg, Krum, MultiKrum): the same models and shares as fedhet's rule, to float32 rounding
    (numpy's median and mean against torch's sort and sum), and the models Flower left out read back from
    its own metric aggregation (the ×100 client is not among Krum's)."""
    strategies = pytest.importorskip("flwr.serverapp.strategy")
    from fedhet.algorithms.robust_aggregation import FLOWER_STRATEGIES

    flower_class = getattr(strategies, FLOWER_STRATEGIES[settings["rule"]])
    calls = []
    original = flower_class.aggregate_train
    monkeypatch.setattr(
        flower_class, "aggregate_train", lambda self, *a: calls.append(type(self)) or original(self, *a)
    )
    ours = _strategy("fedavg", settings, n=6)
    theirs = _strategy("fedavg", {**settings, "implementation": "flower"}, n=6)
    replies = _replies(ours, n=6, hostile=100.0)
    ours.aggregate(1, replies)
    theirs.aggregate(1, replies)
    assert calls == [flower_class]  # Flower's code aggregated, once
    for key, value in ours.model.state_dict().items():
        torch.testing.assert_close(theirs.model.state_dict()[key], value, rtol=1e-5, atol=1e-6)
    assert theirs.round_weights == pytest.approx(ours.round_weights, abs=1e-12)
    if settings["rule"] in ("krum", "multi-krum"):
        assert theirs.round_weights[5] == 0.0 and sum(v > 0 for v in theirs.round_weights.values()) == (
            1 if settings["rule"] == "krum" else 3
        )


def test_implementation_flower_refuses_a_rule_flower_has_not():
    from fedhet.config import from_dict
    from fedhet.errors import ConfigError

    with pytest.raises(ConfigError, match="Flower has no centered-clipping strategy"):
        from_dict({"aggregation": {"rule": "centered-clipping", "implementation": "flower"}})
