"""GTG-Shapley and the per-round reconstruction Shapley value (fedhet.contributions): known answers on toy
utilities, GTG-Shapley against a second implementation (subsets, fedhet.ground_truth.values), its truncations,
an end-to-end FedAvg run reporting both (efficiency against the global model evaluated apart), refusals."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from fedhet.api import as_config
from fedhet.contributions.reconstruction import (
    GTGSettings,
    exact_round_shapley,
    gtg_shapley_round,
    members_of,
    reconstruct,
    shapley_from_table,
)
from fedhet.engine.evaluation import accuracy_of
from fedhet.engine.rounds import RoundListener
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from fedhet.ground_truth.values import shapley_values

NO_TRUNCATION = {"round_truncation": 0.0, "within_truncation": 0.0}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def table_of(n, utility):
    return np.array([utility(mask) for mask in range(1 << n)], dtype=np.float64)


def order_gains(table, order):
    """Each client's gain v(prefix ∪ {i}) − v(prefix) when the clients join in ``order``."""
    gains, mask = np.zeros(len(order)), 0
    for i in order:
        gains[i] = table[mask | 1 << i] - table[mask]
        mask |= 1 << i
    return gains


def toy_round(seed=0, n=4):
    """A round of ``n`` replies of a two-tensor model, unequal sample counts, and a utility of the
    reconstructed model with interactions (a negative squared distance to a target: not additive)."""
    g = torch.Generator().manual_seed(seed)
    start = {"w": torch.randn(6, generator=g, dtype=torch.float64), "steps": torch.tensor(3)}
    models = [
        {"w": start["w"] + torch.randn(6, generator=g, dtype=torch.float64), "steps": torch.tensor(4)}
        for _ in range(n)
    ]
    counts = [30.0, 10.0, 25.0, 5.0][:n]
    target = start["w"] + 0.8

    def utility(mask):
        return -float(((reconstruct(start, models, counts, members_of(mask))["w"] - target) ** 2).sum())

    return start, models, counts, utility


# -- the model of a subset ---------------------------------------------------------------------------------
def test_reconstruction_is_the_start_plus_the_sample_weighted_mean_update():
    start, models, counts, _ = toy_round()
    assert reconstruct(start, models, counts, []) is start
    got = reconstruct(start, models, counts, [0, 2])
    delta = (30 * (models[0]["w"] - start["w"]) + 25 * (models[2]["w"] - start["w"])) / 55
    torch.testing.assert_close(got["w"], start["w"] + delta, rtol=0, atol=1e-12)
    assert int(got["steps"]) == 4  # an integer buffer: the first member's, as FedAvg keeps it


# -- (a) the exact per-round value ---------------------------------------------------------------------------
def test_additive_utility_gives_each_client_its_own_term():
    own = np.array([0.3, -0.1, 0.25, 0.05])
    utility = lambda mask: 0.2 + sum(own[i] for i in members_of(mask))  # noqa: E731
    phi = exact_round_shapley(lambda masks: [utility(s) for s in masks], 4)
    np.testing.assert_allclose(phi, own, atol=1e-12)


def test_exact_round_value_equals_the_ground_truth_module_on_reconstructed_models():
    _, _, _, utility = toy_round(seed=3)
    table = table_of(4, utility)
    np.testing.assert_allclose(shapley_from_table(table), shapley_values(table), atol=1e-12)
    assert shapley_from_table(table).sum() == pytest.approx(table[-1] - table[0], abs=1e-12)


# -- (b) GTG-Shapley against the subset formula --------------------------------------------------------------
def test_gtg_without_truncation_converges_to_the_exact_per_round_value():
    _, _, _, utility = toy_round(seed=1)
    table = table_of(4, utility)
    exact = shapley_values(table)  # subsets (fedhet.ground_truth.values); GTG samples permutations
    permutations = 10_000
    result = gtg_shapley_round(
        utility,
        4,
        np.random.default_rng(0),
        GTGSettings(**NO_TRUNCATION, min_permutations=permutations, max_permutations=permutations),
    )
    assert result.permutations == permutations and not result.skipped
    # every permutation's gains sum to v(N) − v(∅): so does their mean, exactly (no truncation)
    assert result.values.sum() == pytest.approx(table[-1] - table[0], rel=1e-12)
    # within 3 standard errors σ_i/√P, σ_i the spread of client i's gain over all N! orders (sampling with
    # the first position stratified, as GTG does, has no larger variance: over seeds 0..19 of this round
    # and two others the error stayed under 0.6 of this bound)
    gains = np.array([order_gains(table, order) for order in itertools.permutations(range(4))])
    np.testing.assert_allclose(gains.mean(axis=0), exact, atol=1e-12)  # all orders: a third implementation
    tolerance = 3 * gains.std(axis=0) / np.sqrt(permutations)
    assert np.all(np.abs(result.values - exact) <= tolerance), (result.values - exact, tolerance)
    assert tolerance.max() < 0.05 * np.abs(exact).max()  # tight enough to catch a biased estimator
    assert result.evaluations == 16  # every subset once: the memo


def test_gtg_stops_once_the_running_estimate_settles():
    own = [0.3, -0.1, 0.25, 0.05]
    result = gtg_shapley_round(lambda s: sum(own[i] for i in members_of(s)), 4, np.random.default_rng(0))
    # additive: every permutation gives the exact value, so the rule stops at the first whole block past
    # max(30, N) permutations
    assert result.converged and result.permutations == 32
    np.testing.assert_allclose(result.values, own, atol=1e-12)


def test_within_round_truncation_gives_the_rest_of_a_permutation_nothing():
    # v({0}) = v(N): a permutation that starts with client 0 stops there. Exact: (1, 1/2, −1/2); with
    # truncation the six orders' gains are 0 first → (1,0,0) twice; 1 first → (2,0,−1), (1,0,0); 2 first →
    # (0,1,0), (1,0,0): on average (1, 1/6, −1/6)
    worth = {0: 0.0, 1: 1.0, 2: 0.0, 4: 0.0, 3: 2.0, 5: 0.0, 6: 0.0, 7: 1.0}
    np.testing.assert_allclose(shapley_values(table_of(3, worth.__getitem__)), [1, 0.5, -0.5], atol=1e-12)
    many = {"min_permutations": 6000, "max_permutations": 6000}
    v = worth.__getitem__
    off = gtg_shapley_round(v, 3, np.random.default_rng(1), GTGSettings(**NO_TRUNCATION, **many))
    on = gtg_shapley_round(v, 3, np.random.default_rng(1), GTGSettings(**many))
    np.testing.assert_allclose(off.values, [1, 0.5, -0.5], atol=0.02)  # Monte-Carlo error < 0.005 here
    np.testing.assert_allclose(on.values, [1, 1 / 6, -1 / 6], atol=0.02)


# -- (c) between-round truncation ----------------------------------------------------------------------------
def test_a_round_whose_utility_does_not_move_is_skipped_with_all_zeros():
    worth = lambda s: {0: 0.5, 1: 0.7, 2: 0.3, 3: 0.5}[s]  # noqa: E731  v(N) = v(∅), yet 0 and 1 differ
    asked = []

    def utility(s):
        asked.append(s)
        return worth(s)

    skipped = gtg_shapley_round(utility, 2, np.random.default_rng(0))
    assert skipped.skipped and skipped.permutations == 0
    np.testing.assert_array_equal(skipped.values, [0.0, 0.0])
    assert sorted(asked) == [0, 3]  # only U(w_t) and U(w_{t+1})
    # the round's exact values are not 0 (Σ φ = 0 only): the zeros are the truncation's
    np.testing.assert_allclose(shapley_values(table_of(2, worth)), [0.2, -0.2], atol=1e-12)
    kept = gtg_shapley_round(worth, 2, np.random.default_rng(0), GTGSettings(**NO_TRUNCATION))
    assert not kept.skipped
    np.testing.assert_allclose(kept.values, [0.2, -0.2], atol=1e-12)


# -- (d) end to end ------------------------------------------------------------------------------------------
DIGITS = {
    "data": {"dataset": "digits", "clients": 4, "split": "iid", "validation_fraction": 0.1},
    "model": {"name": "mlp"},
    "method": {"name": "fedavg"},
    "train": {"rounds": 3, "lr": 0.1},
    "eval": {"fairness": False, "contribution_estimators": ["gtg-shapley", "or-shapley"]},
}


class GlobalAccuracy(RoundListener):
    """U(w_t) measured apart from the estimators: the global model's validation accuracy at the start and
    after each round."""

    def __init__(self) -> None:
        self.sim = None
        self.utilities: list[float] = []

    def measure(self) -> None:
        x, y = self.sim.fed.validation
        self.utilities.append(accuracy_of(self.sim.strategy.global_model(), x, y))

    def start(self, run_dir):
        self.measure()

    def round_done(self, rnd, line):
        self.measure()


def test_a_fedavg_run_reports_both_estimators_with_per_round_efficiency(tmp_path):
    listener = GlobalAccuracy()
    sim = make_simulation(as_config(DIGITS), run_dir=tmp_path / "run", listeners=[listener])
    listener.sim = sim
    summary = sim.run()
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(written["estimates"]) == {"gtg_shapley", "or_shapley"}
    assert summary["contributions"] is None  # FedAvg estimates none of its own; the estimates stay apart
    lines = [json.loads(t) for t in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    u = listener.utilities
    assert len(lines) == 3 and len(u) == 4
    for rnd, line in enumerate(lines):
        est = line["estimates"]
        gain = u[rnd + 1] - u[rnd]
        assert est["utility"] == {"start": u[rnd], "all": u[rnd + 1]}
        assert abs(sum(est["or_shapley"]) - gain) <= 1e-9  # efficiency, against the global model
        # GTG: efficient up to its within-round truncation threshold (or 0 for a skipped round)
        assert abs(sum(est["gtg_shapley"]) - gain) <= 0.001 + 1e-9 or est["permutations"]["gtg_shapley"] == 0
        assert est["evaluations"]["or_shapley"] == 16
    for key in ("gtg_shapley", "or_shapley"):
        sums = np.sum([line["estimates"][key] for line in lines], axis=0)
        assert np.all(np.isfinite(written["estimates"][key]))
        np.testing.assert_allclose(written["estimates"][key], sums, atol=1e-12)
    assert any(abs(v) > 0 for v in written["estimates"]["or_shapley"])  # the run learned: values move


# -- (e) refusals --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": {"validation_fraction": 0.0}}, "data.validation_fraction"),
        ({"method": {"name": "shapfed"}, "eval": {"fairness": False}}, "upload updates"),
        ({"method": {"name": "standalone"}}, "not an average of client models"),
        ({"data": {"clients": 13}, "eval": {"contribution_estimators": ["or-shapley"]}}, "gtg-shapley alone"),
    ],
)
def test_runs_the_estimators_cannot_value_are_refused(tmp_path, change, message):
    cfg = {k: dict(v) for k, v in DIGITS.items()}
    for section, values in change.items():
        cfg[section] = {**cfg[section], **values}
    with pytest.raises(ConfigError, match=message):
        make_simulation(as_config(cfg), run_dir=tmp_path / "run").run()


def test_an_unknown_estimator_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"choose among \['gtg-shapley', 'or-shapley'\]"):
        as_config({**DIGITS, "eval": {"contribution_estimators": ["tmc-shapley"]}})
