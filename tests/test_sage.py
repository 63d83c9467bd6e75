"""SAGE: the confidence-discrepancy soft targets on a hand example, and a tiny end-to-end run."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.algorithms import build_strategy
from fedhet.algorithms.sage import DEFAULT_DISCREPANCY_SCALE, sage_targets
from fedhet.config import ExperimentConfig
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_kappa_gives_one_half_at_a_gap_of_five_points():
    assert DEFAULT_DISCREPANCY_SCALE == pytest.approx(math.log(2) / 0.05)


def test_sage_targets_on_a_hand_example():
    local = torch.tensor([[0.97, 0.03], [0.9, 0.1], [0.96, 0.04], [0.99, 0.01]])
    global_ = torch.tensor([[0.2, 0.8], [0.3, 0.7], [0.09, 0.91], [0.96, 0.04]])
    out = sage_targets(local, global_, threshold=0.95, discrepancy_scale=DEFAULT_DISCREPANCY_SCALE)
    # row 0: local confident, labels differ; Δ = |0.97 − 0.8| + 1e-6, λ = 2^(−Δ/0.05)
    lam0 = 2 ** (-(0.17 + 1e-6) / 0.05)
    assert out.targets[0].tolist() == pytest.approx([lam0, 1 - lam0], abs=1e-6)
    # row 1: local not confident -> the global one-hot; neither model confident -> masked out
    assert out.targets[1].tolist() == [0.0, 1.0]
    # row 2: Δ = 0.05 (+1e-6) -> λ ≈ 1/2, an even mix of the two labels
    assert out.targets[2].tolist() == pytest.approx([0.5, 0.5], abs=1e-4)
    # row 3: both say class 0 -> the mix is the one-hot whatever λ
    assert out.targets[3].tolist() == pytest.approx([1.0, 0.0], abs=1e-7)
    assert out.mask.tolist() == [1.0, 0.0, 1.0, 1.0]  # [c_L ≥ τ] ∨ [c_G ≥ τ]
    assert out.labels.tolist() == [1, 1, 1, 0]  # argmax of the target (row 2: λ just below 1/2)


def test_invalid_options():
    with pytest.raises(ConfigError, match="discrepancy_scale"):
        build_strategy("sage", {"discrepancy_scale": -1.0})
    with pytest.raises(ConfigError, match="SAGE"):
        build_strategy("sage", {"targets": "soft"})


def test_sage_runs_end_to_end(tmp_path):
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split = "fashion-mnist", "labeled-unlabeled"
    cfg.data.split_params = {"labeled_per_class": 20, "alpha": 0.5}
    cfg.data.clients, cfg.data.max_train_samples, cfg.data.max_test_samples = 4, 2000, 300
    cfg.model.name, cfg.model.params = "resnet8", {"width": 4}
    cfg.train.rounds, cfg.train.clients_per_round, cfg.train.local_steps, cfg.train.batch_size = 2, 2, 2, 8
    cfg.eval.fairness, cfg.eval.rewards = False, False
    cfg.method.name, cfg.method.params = "sage", {"threshold": 0.3}
    summary = make_simulation(cfg, run_dir=tmp_path / "run").run()
    assert 0.0 <= summary["final"]["accuracy"] <= 1.0
    rows = (tmp_path / "run" / "fssl_rounds.csv").read_text().splitlines()
    assert len(rows) == 3 and "unlabeled_used_fraction" in rows[0]
