"""FedProx and FedProx+FixMatch: the proximal term's value and gradient, and end-to-end runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.algorithms import build_strategy
from fedhet.algorithms.fedprox import (
    FedProxFixMatchTrainer,
    FedProxLabeledTrainer,
    FedProxTrainer,
    proximal_term,
)
from fedhet.config import ExperimentConfig
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from support import prepared_update


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_proximal_term_known_answer_and_gradient():
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
        layer.bias.fill_(3.0)
    reference = {"weight": torch.zeros(1, 2), "bias": torch.ones(1)}
    term = proximal_term(layer, reference)
    assert float(term.detach()) == pytest.approx(1 + 4 + 4)  # ‖w − w_g‖² = 1² + 2² + (3 − 1)²
    term.backward()
    assert layer.weight.grad.tolist() == [[2.0, 4.0]] and layer.bias.grad.tolist() == [4.0]


def tiny_config(method: str, **params) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split = "fashion-mnist", "labeled-unlabeled"
    cfg.data.split_params = {"labeled_per_class": 20, "alpha": 0.5}
    cfg.data.clients, cfg.data.max_train_samples, cfg.data.max_test_samples = 4, 2000, 300
    cfg.model.name, cfg.model.params = "resnet8", {"width": 4}
    cfg.train.rounds, cfg.train.clients_per_round, cfg.train.local_steps, cfg.train.batch_size = 2, 2, 3, 8
    cfg.eval.fairness, cfg.eval.rewards = False, False
    cfg.method.name, cfg.method.params = method, params
    return cfg


TRAINERS = {
    "fedprox": FedProxTrainer,
    "fedprox-labeled": FedProxLabeledTrainer,
    "fedprox-fixmatch": FedProxFixMatchTrainer,
}


@pytest.mark.parametrize("method", sorted(TRAINERS))
def test_the_proximal_term_enters_the_local_loss(method):
    sim = make_simulation(tiny_config(method, mu=0.5))
    sim.setup()
    assert isinstance(sim.trainer, TRAINERS[method])
    data = sim.fed.clients[0]
    ins = sim.strategy.configure(1, [0])[0]
    assert ins.config["proximal_mu"] == 0.5
    trainer = sim.trainer
    model = sim.work_model
    u = prepared_update(trainer, model, data, ins, sim.cfg.train)
    batch = next(iter(trainer.batches(u)))
    with torch.no_grad():  # move away from w_g so the term is non-zero
        for p in model.parameters():
            p.add_(0.1)
    with_prox = float(trainer.loss(u, batch).detach())
    u.scratch.proximal_mu = 0.0
    without = float(trainer.loss(u, batch).detach())
    expected = 0.25 * sum(p.numel() * 0.01 for p in model.parameters())
    assert with_prox - without == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("method", sorted(TRAINERS))
def test_fedprox_runs_end_to_end(tmp_path, method):
    summary = make_simulation(tiny_config(method), run_dir=tmp_path / "run").run()
    assert 0.0 <= summary["final"]["accuracy"] <= 1.0


@pytest.mark.parametrize("method", ["fedprox", "fedprox-labeled"])
def test_fedprox_trains_on_labeled_data_only_and_validates_mu(method):
    sim = make_simulation(tiny_config(method))
    sim.setup()
    data = sim.fed.clients[0]
    u = prepared_update(sim.trainer, sim.work_model, data, sim.strategy.configure(1, [0])[0], sim.cfg.train)
    labeled = set(data.indices.tolist())
    labels = {int(data.labels[i]) for i in labeled}
    for _, y in sim.trainer.batches(u):
        assert set(y.tolist()) <= labels
    assert build_strategy(method, {}).mu == 0.001
    with pytest.raises(ConfigError, match="mu"):
        build_strategy(method, {"mu": -1})
