"""A run warns when its training loss still falls steeply at its last round (fedhet.engine.convergence)."""

from __future__ import annotations

import logging

import pytest

import fedhet
from fedhet.engine.convergence import late_decrease_share, still_learning


def test_late_share_by_hand():
    losses = [1.0, 0.8, 0.6, 0.5, 0.45, 0.4, 0.38, 0.36, 0.35, 0.34]
    # ten rounds: windows of two; the fifth before the last averages 0.37, the last 0.345, the whole
    # decrease is 1 - 0.345 = 0.655
    assert late_decrease_share(losses) == pytest.approx(0.025 / 0.655, rel=1e-12)
    assert still_learning([{"train_loss": v} for v in losses]) is None  # 3.8 % < 10 %
    steep = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]  # linear: last fifth = 0.2 / 0.85 of it
    assert late_decrease_share(steep) == pytest.approx(0.2 / 0.85, rel=1e-12)
    assert "still falling" in still_learning([{"round": 0}, *({"train_loss": v} for v in steep)])
    assert late_decrease_share([0.5, 0.6, 0.7, 0.8, 0.9]) is None  # no decrease: nothing to say
    assert late_decrease_share([1.0, 0.5, 0.2]) is None  # too few rounds


@pytest.mark.parametrize("rounds, warns", [(10, True), (100, False)])
def test_wine_run_warns_only_when_stopped_early(rounds, warns, caplog):
    # measured at seed 0 (5 clients, Dir(1)): 25 % of the decrease in the last fifth at 10 rounds (accuracy
    # 82 %), 2 % at 100 rounds (accuracy 100 %)
    overrides = {
        "data.dataset": "wine",
        "data.clients": 5,
        "data.split": "dirichlet-per-class",
        "data.split_params": {"alpha": 1.0},
        "model.name": "tabular-mlp",
        "method.name": "fedavg",
        "train.rounds": rounds,
        "train.threads": 1,
    }
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        fedhet.run(None, overrides=overrides)
    found = [r.getMessage() for r in caplog.records if "still falling" in r.getMessage()]
    assert bool(found) == warns, found
    if warns:
        assert found[0].startswith("fedavg seed 0: ") and "train.rounds" in found[0]
