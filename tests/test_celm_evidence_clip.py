"""CELM's ``evidence_clip``: each client's update probed at most k × the round's median update norm, so a
client that lengthens its update (the ``adaptive-scale`` attack) reads as no more evidence
(docs/robustness.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.algorithms import build_strategy
from fedhet.algorithms.celm import CELM, clip_to_median
from fedhet.config import ExperimentConfig
from fedhet.engine import checkpoint as ckpt
from fedhet.engine.protocol import Reply
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation

FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
needs_fashion = pytest.mark.skipif(not FASHION.exists(), reason="Fashion-MNIST idx files missing")


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_clip_to_median_known_answer():
    # updates (3, 4), (1, 0), (0, 2) from (1, 1): norms 5, 1, 2, median 2
    ref = {"w": torch.tensor([1.0, 1.0]), "count": torch.tensor(7)}
    states = [
        {"w": torch.tensor([4.0, 5.0]), "count": torch.tensor(9)},
        {"w": torch.tensor([2.0, 1.0]), "count": torch.tensor(9)},
        {"w": torch.tensor([1.0, 3.0]), "count": torch.tensor(9)},
    ]
    out, scales = clip_to_median(states, [ref] * 3, 1.0)
    assert scales == pytest.approx([2 / 5, 1.0, 1.0])
    # (1, 1) + 2/5 · (3, 4) = (2.2, 2.6), norm 2 = the median; the others are the same objects
    torch.testing.assert_close(out[0]["w"], torch.tensor([2.2, 2.6]))
    assert out[0]["count"].item() == 9  # an integer buffer is not an update: left as sent
    assert out[1] is states[1] and out[2] is states[2]
    out, scales = clip_to_median(states, [ref] * 3, 2.0)  # bound 4: (1, 1) + 4/5 · (3, 4)
    assert scales == pytest.approx([4 / 5, 1.0, 1.0])
    torch.testing.assert_close(out[0]["w"], torch.tensor([3.4, 4.2]))


def test_evidence_clip_must_be_off_or_at_least_one():
    assert CELM().evidence_clip == 1.0  # fedhet's default: at most the round's median length
    assert CELM(evidence_clip=0).evidence_clip == 0.0  # the paper: no clipping
    assert build_strategy("celm", {"evidence_clip": 2}).evidence_clip == 2.0
    for bad in (0.5, -1, float("nan"), "1"):
        with pytest.raises(ConfigError, match="evidence_clip"):
            CELM(evidence_clip=bad)


def small_config(**params) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "iid", 3
    cfg.data.max_train_samples, cfg.data.max_test_samples = 1500, 500
    cfg.model.name = "mlp"
    cfg.train.rounds = 4
    cfg.eval.fairness = False
    cfg.eval.checkpoint_every = 1
    cfg.method.name = "celm"
    cfg.method.params = {"warmup_fraction": 0.5, "probe_steps": 30, **params}
    return cfg


def _replies(strategy: CELM, factor: float) -> dict[int, Reply]:
    """Round 1 (every client sent the full model): honest clients 0 and 1 with updates of equal norm, client
    2 sending client 0's update × ``factor``."""
    torch.manual_seed(3)
    sent = strategy.model.state_dict()
    delta_a = {k: 0.05 * torch.randn_like(v) for k, v in sent.items()}
    delta_b = {k: 0.05 * torch.randn_like(v) for k, v in sent.items()}
    norm = lambda d: float(sum(t.double().pow(2).sum() for t in d.values()).sqrt())  # noqa: E731
    delta_b = {k: v * (norm(delta_a) / norm(delta_b)) for k, v in delta_b.items()}
    return {
        0: Reply(weights={k: sent[k] + delta_a[k] for k in sent}, num_examples=1),
        1: Reply(weights={k: sent[k] + delta_b[k] for k in sent}, num_examples=1),
        2: Reply(weights={k: sent[k] + factor * delta_a[k] for k in sent}, num_examples=1),
    }


@needs_fashion
@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_a_lengthened_update_buys_evidence_only_without_the_clip(clip):
    sim = make_simulation(small_config(evidence_clip=clip), run_dir=None)
    sim.setup()
    strategy: CELM = sim.strategy
    replies = _replies(strategy, 3.0)
    probed = strategy.probed_states([0, 1, 2], replies)
    if clip:
        # norms ‖Δ‖, ‖Δ‖, 3‖Δ‖: the median is ‖Δ‖, so client 2 is probed as sent + Δ_0: client 0's model
        for key, value in replies[0].weights.items():
            torch.testing.assert_close(probed[3][key], value, rtol=0, atol=1e-6)
    strategy.before_aggregate(1, replies)
    raw = strategy.evidence[-1]["raw"]
    c = strategy.contribution
    # measured (probe_steps 30): evidence sums 82.5 (client 0) vs 895 (client 2) off, vs 81.7 on; weights
    # 0.199 vs 0.594 off, 0.326 vs 0.323 on
    if clip:
        # the same model, probed from other start noise: the same evidence to the probe's spread
        assert raw[2].sum() <= 1.05 * raw[0].sum(), raw
        assert c[2] <= c[0] + 0.02, c
    else:
        assert raw[2].sum() > 1.5 * raw[0].sum(), raw  # the paper's estimate reads length as evidence
        assert c[2] > c[0] + 0.05, c


@needs_fashion
def test_a_kept_heads_update_starts_from_the_head_the_client_last_sent():
    sim = make_simulation(small_config(evidence_clip=1.0), run_dir=None)
    sim.setup()
    strategy: CELM = sim.strategy
    replies = _replies(strategy, 3.0)
    strategy.before_aggregate(1, {0: replies[0], 1: replies[1]})  # client 2 absent in round 1
    strategy.aggregate(1, {0: replies[0], 1: replies[1]})
    now = strategy.model.state_dict()
    refs = strategy.update_references([0, 2], now)
    heads, backbone = strategy.model.head_keys(), strategy.backbone_keys
    for key in backbone:  # the backbone both were sent: the global one
        assert torch.equal(refs[0][key], now[key]) and torch.equal(refs[1][key], now[key])
    for key in heads:  # client 0 kept the head it sent; client 2 is new, so it was sent the global head
        assert torch.equal(refs[0][key], replies[0].weights[key])
        assert torch.equal(refs[1][key], now[key])


@needs_fashion
def test_the_kept_heads_round_trip_through_a_checkpoint_and_the_paper_evidence_keeps_none(tmp_path):
    sim = make_simulation(small_config(evidence_clip=1.0), run_dir=None)
    sim.run()
    assert set(sim.strategy.heads) == {0, 1, 2}
    path = ckpt.save_checkpoint(tmp_path / "ck", {"strategy": sim.strategy.state_dict()})
    fresh = build_strategy("celm", sim.cfg.method.params)
    fresh.setup(sim.info)
    fresh.load_state_dict(ckpt.load_checkpoint(path)["strategy"])
    for cid, head in sim.strategy.heads.items():
        assert all(torch.equal(fresh.heads[cid][k], v) for k, v in head.items())
    off = make_simulation(small_config(evidence_clip=0), run_dir=None)
    off.run()
    assert "heads" not in off.strategy.state_dict()["celm"]  # the paper's evidence: its checkpoint as before
