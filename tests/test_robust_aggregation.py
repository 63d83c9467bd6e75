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
