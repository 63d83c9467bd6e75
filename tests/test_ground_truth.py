"""Ground truth for contributions: exact values from hand-solved games and a second implementation, and every
coalition's model trained together equal to one embedded run per coalition (``train.participants``)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from fedhet.config import ExperimentConfig, apply_overrides
from fedhet.errors import ConfigError
from fedhet.ground_truth import coalitions
from fedhet.ground_truth.values import banzhaf_values, leave_one_out_values, shapley_values


def game(n, worth):
    """A utility table from a function of the coalition (a frozenset of client ids)."""
    return np.array([worth(frozenset(i for i in range(n) if mask >> i & 1)) for mask in range(1 << n)])


# -- the values: closed forms and hand-solved games ---------------------------------------------------------
def test_additive_game_gives_every_value_each_clients_own_worth():
    own = [0.3, -0.1, 0.25, 0.05]
    u = game(4, lambda s: 0.1 + sum(own[i] for i in s))  # u(∅) = 0.1 changes no marginal gain
    for values in (shapley_values(u), banzhaf_values(u), leave_one_out_values(u)):
        np.testing.assert_allclose(values, own, atol=1e-12)


def test_majority_game_by_hand():
    # u = 1 when at least 2 of 3 hold: by symmetry Shapley 1/3 each; Banzhaf: i is pivotal for the 2 of the
    # 4 coalitions of the others holding exactly one client → 1/2; no one alone is missed by the other two →
    # LOO 0
    u = game(3, lambda s: float(len(s) >= 2))
    np.testing.assert_allclose(shapley_values(u), [1 / 3] * 3, atol=1e-12)
    np.testing.assert_allclose(banzhaf_values(u), [0.5] * 3, atol=1e-12)
    np.testing.assert_allclose(leave_one_out_values(u), [0.0] * 3, atol=1e-12)


def test_glove_game_by_hand():
    # client 0 holds a left glove, 1 and 2 right ones; a pair is worth 1. Orders (6): 0 is pivotal whenever
    # it is not first (4 of 6) → 2/3; each right glove when it follows 0 and precedes the other right (1 of
    # 6) → 1/6. Banzhaf: 0 pivotal for {1}, {2}, {1,2} → 3/4; 1 only for {0} → 1/4. LOO: 1, 0, 0.
    u = game(3, lambda s: float(0 in s and bool(s & {1, 2})))
    np.testing.assert_allclose(shapley_values(u), [2 / 3, 1 / 6, 1 / 6], atol=1e-12)
    np.testing.assert_allclose(banzhaf_values(u), [3 / 4, 1 / 4, 1 / 4], atol=1e-12)
    np.testing.assert_allclose(leave_one_out_values(u), [1.0, 0.0, 0.0], atol=1e-12)


def test_shapley_equals_the_mean_marginal_gain_over_every_order():
    """A second implementation sharing nothing with the first: the average over all N! join orders."""
    rng = np.random.default_rng(7)
    n = 5
    worth = {
        frozenset(s): float(rng.random()) for k in range(n + 1) for s in itertools.combinations(range(n), k)
    }
    u = game(n, worth.__getitem__)
    gains = np.zeros(n)
    for order in itertools.permutations(range(n)):
        held: frozenset[int] = frozenset()
        for i in order:
            gains[i] += worth[held | {i}] - worth[held]
            held = held | {i}
    np.testing.assert_allclose(shapley_values(u), gains / math.factorial(n), atol=1e-12)
    assert shapley_values(u).sum() == pytest.approx(u[-1] - u[0], abs=1e-12)  # efficiency
    banzhaf = [
        np.mean(
            [
                worth[frozenset(s) | {i}] - worth[frozenset(s)]
                for k in range(n)
                for s in itertools.combinations([j for j in range(n) if j != i], k)
            ]
        )
        for i in range(n)
    ]
    np.testing.assert_allclose(banzhaf_values(u), banzhaf, atol=1e-12)


def test_a_table_of_the_wrong_size_is_refused():
    with pytest.raises(ConfigError, match="2\\*\\*N entries"):
        shapley_values(np.zeros(6))
    with pytest.raises(ConfigError, match="non-finite"):
        shapley_values(np.array([0.0, 1.0, np.nan, 1.0]))


# -- every coalition's model -------------------------------------------------------------------------------
def digits(clients=3, rounds=2, **more):
    cfg = ExperimentConfig()
    overrides = {
        "data.dataset": "digits",
        "data.clients": clients,
        "data.split": "dirichlet-per-class",
        "train.rounds": rounds,
        "train.threads": 1,
        **more,
    }
    apply_overrides(cfg, [(k, json.dumps(v)) for k, v in overrides.items()])
    return cfg


@pytest.mark.parametrize(
    "more",
    [
        {},  # the fused closed-form step
        {"train.momentum": 0.5},  # the gradient-then-step one
        {"faults.clients.1": "label-flip"},  # a client whose labels are wrong, in every coalition it joins
    ],
)
def test_coalitions_trained_together_equal_one_run_per_coalition(more):
    cfg = digits(**more)
    together = coalitions.train_together(cfg, keep_weights=True)
    alone = coalitions.train_one_at_a_time(cfg, keep_weights=True)
    # float reassociation only (stacked products, an index_add_ for the average): 1e-5 of weights of ~0.3
    for name, stacked in together.weights.items():
        torch.testing.assert_close(stacked, alone.weights[name], atol=1e-5, rtol=0)
    test_size = 1 / together.utilities["accuracy"][0] if together.utilities["accuracy"][0] else None
    assert test_size is None or test_size > 1
    # an argmax may flip on a near-tie: at most one test sample in 400 per coalition
    np.testing.assert_allclose(together.utilities["accuracy"], alone.utilities["accuracy"], atol=1 / 400)
    np.testing.assert_allclose(together.utilities["loss"], alone.utilities["loss"], rtol=1e-5)
    # the coalitions differ: a federation of one client is not the whole federation
    assert len({round(float(a), 6) for a in alone.utilities["accuracy"][1:]}) > 3


def test_an_interrupted_training_resumes_exactly(tmp_path, monkeypatch):
    cfg = digits(rounds=3)
    whole = coalitions.train_together(cfg, keep_weights=True)
    monkeypatch.setattr(coalitions, "CHECKPOINT_S", 0.0)
    checkpoint = tmp_path / "coalitions.pt"

    def stop_after_two(rnd, _total):
        if rnd == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        coalitions.train_together(cfg, progress=stop_after_two, checkpoint=checkpoint)
    seen = []
    resumed = coalitions.train_together(
        cfg, keep_weights=True, checkpoint=checkpoint, progress=lambda r, _t: seen.append(r)
    )
    assert seen == [3]  # rounds 1 and 2 came from the checkpoint
    for name, stacked in whole.weights.items():
        assert torch.equal(stacked, resumed.weights[name])  # the same code path: bit for bit


def test_what_has_no_ground_truth_is_refused():
    with pytest.raises(ConfigError, match="2 to 12 clients"):
        coalitions.train_together(digits(clients=13))
    with pytest.raises(ConfigError, match="clients_per_round"):
        coalitions.train_together(digits(**{"train.clients_per_round": 0.5}))
    with pytest.raises(ConfigError, match="one_at_a_time"):
        coalitions.train_together(digits(**{"method.name": "fedprox"}))
    with pytest.raises(ConfigError, match="faults given: noise"):
        coalitions.train_together(digits(**{"faults.clients.0": "noise"}))


# -- the command ---------------------------------------------------------------------------------------------
def test_fedhet_shapley_records_each_seed_and_reuses_it(tmp_path, capsys, monkeypatch):
    from fedhet.cli import main
    from fedhet.ground_truth import measure

    argv = [
        "shapley",
        "--dataset",
        "digits",
        "--clients",
        "3",
        "--rounds",
        "2",
        "--split",
        "dirichlet-per-class",
        "--seeds",
        "2",
        "--set",
        "train.threads=1",
        "--out",
        str(tmp_path),
        "--json",
        "--quiet",
    ]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    records = sorted(p.name for p in tmp_path.glob("*.json"))
    assert records == ["fedavg-seed0.json", "fedavg-seed1.json"]
    assert not list(tmp_path.glob("*.pt"))  # the checkpoints are gone once a seed is recorded
    shapley = np.array(first["clients"]["shapley"]["per_seed"])
    np.testing.assert_allclose(
        shapley.sum(axis=1), np.array(first["full_federation"]) - first["empty_coalition"], atol=1e-9
    )
    # the mean and interval are of the per-seed values
    np.testing.assert_allclose(first["clients"]["shapley"]["mean"], shapley.mean(axis=0), atol=1e-12)
    assert first["reused"] == [False, False]
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["reused"] == [True, True] and again["clients"] == first["clients"]
    monkeypatch.setattr(measure, "RESULTS_VERSION", measure.RESULTS_VERSION + 1)  # a change of the numbers
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["reused"] == [False, False]


@pytest.mark.parametrize(
    ("participants", "message"),
    [
        ("[]", "non-empty list"),
        ("[0, 0]", "appear once"),
        ("[3]", "each id must be in 0..2"),
        ('["a"]', "list"),
    ],
)
def test_bad_participants_are_refused_by_name(participants, message):
    with pytest.raises(ConfigError, match=message):
        digits(**{"train.participants": json.loads(participants)})
