"""FedProto + FSSL: prototype aggregation, the prototype term, sample selection, and an end-to-end run."""

from __future__ import annotations

import pytest
import torch

from fedhet.algorithms import build_strategy
from fedhet.algorithms.fedproto import aggregate_prototypes, prototype_loss, prototype_members
from fedhet.algorithms.fssl import PseudoTargets, SemiSupervisedBatch, SemiSupervisedStep
from fedhet.config import ExperimentConfig
from fedhet.engine import checkpoint as ckpt
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_prototype_aggregation_by_clients_and_by_samples():
    # two clients, 3 classes, 1-d features; class 2 seen by nobody keeps its previous prototype
    sums = torch.tensor([[[2.0], [9.0], [0.0]], [[12.0], [0.0], [0.0]]], dtype=torch.float64)
    counts = torch.tensor([[1.0, 3.0, 0.0], [3.0, 0.0, 0.0]], dtype=torch.float64)
    previous = torch.tensor([[0.0], [0.0], [7.0]], dtype=torch.float64)
    present = torch.tensor([False, False, True])
    by_clients, seen = aggregate_prototypes(sums, counts, previous, present, "clients")
    assert by_clients.flatten().tolist() == pytest.approx([(2.0 + 4.0) / 2, 3.0, 7.0])
    assert seen.tolist() == [True, True, True]
    by_samples, _ = aggregate_prototypes(sums, counts, previous, present, "samples")
    assert by_samples.flatten().tolist() == pytest.approx([14.0 / 4, 3.0, 7.0])


def test_prototype_loss_skips_classes_without_a_prototype():
    feats = torch.tensor([[1.0, 1.0], [3.0, 3.0]])
    protos = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    present = torch.tensor([True, False])
    assert float(prototype_loss(feats, torch.tensor([0, 1]), protos, present)) == pytest.approx(1.0)
    assert float(prototype_loss(feats, torch.tensor([1, 1]), protos, present)) == 0.0
    # weights leave samples out: (1² + 1²)/2 for the first alone; 0 when the only kept one has no prototype
    weights = torch.tensor([1.0, 0.0])
    assert float(prototype_loss(feats, torch.tensor([0, 0]), protos, present, weights)) == pytest.approx(1.0)
    assert float(prototype_loss(feats, torch.tensor([1, 0]), protos, present, weights)) == 0.0


def test_prototype_members_follow_the_variant():
    batch = SemiSupervisedBatch(
        torch.zeros(2, 1), torch.tensor([0, 1]), torch.zeros(3, 1), torch.zeros(3, 1), torch.zeros(3), True
    )
    features = torch.arange(8, dtype=torch.float32).reshape(8, 1)  # rows: x0 x1 | w0 w1 w2 | s0 s1 s2
    pseudo = PseudoTargets(torch.zeros(3, 2), torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1, 0, 0]))
    step = SemiSupervisedStep(batch, features, torch.zeros(8, 2), 2, 3, pseudo=pseudo)
    f, y, w = prototype_members(step, "confident")
    assert f.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0] and y.tolist() == [0, 1, 1, 0, 0]
    assert w.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0]  # w1 is not confident
    f, y, w = prototype_members(step, "all")
    assert f.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0] and y.tolist() == [0, 1, 1, 0, 0]
    assert w.tolist() == [1.0] * 5
    f, y, w = prototype_members(step, "labeled")
    assert f.flatten().tolist() == [0.0, 1.0] and y.tolist() == [0, 1] and w.tolist() == [1.0, 1.0]


def test_invalid_options():
    with pytest.raises(ConfigError, match="prototype_samples"):
        build_strategy("fedproto-fssl", {"prototype_samples": "some"})
    with pytest.raises(ConfigError, match="prototype_aggregation"):
        build_strategy("fedproto-fssl", {"prototype_aggregation": "median"})


def test_fedproto_runs_end_to_end_and_its_state_round_trips(tmp_path):
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split = "fashion-mnist", "labeled-unlabeled"
    cfg.data.split_params = {"labeled_per_class": 20, "alpha": 0.5}
    cfg.data.clients, cfg.data.max_train_samples, cfg.data.max_test_samples = 4, 2000, 300
    cfg.model.name, cfg.model.params = "resnet8", {"width": 4}
    cfg.train.rounds, cfg.train.clients_per_round, cfg.train.local_steps, cfg.train.batch_size = 3, 2, 2, 8
    cfg.eval.fairness, cfg.eval.rewards = False, False
    cfg.method.name, cfg.method.params = "fedproto-fssl", {"threshold": 0.3}
    sim = make_simulation(cfg, run_dir=tmp_path / "run")
    sim.run()
    strategy = sim.strategy
    assert bool(strategy.present.any()) and strategy.prototypes.shape == (10, 16)
    assert torch.isfinite(strategy.prototypes).all()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert "loss_prototype" in lines  # the term is active once prototypes exist (rounds 2-3)
    ckpt.save_checkpoint(tmp_path / "ck", {"s": strategy.state_dict()})
    other = build_strategy("fedproto-fssl", {"threshold": 0.3})
    other.setup(sim.info)
    other.load_state_dict(ckpt.load_checkpoint(tmp_path / "ck")["s"])
    assert torch.equal(other.prototypes, strategy.prototypes) and torch.equal(other.present, strategy.present)
