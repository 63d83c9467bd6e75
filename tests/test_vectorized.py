"""engine.mode = "vectorized": the round's clients trained at once give the sequential engine's results.

Tolerance (stated in docs/performance.md): after 3 rounds every global weight within 1e-5 of the
sequential run's, and the same test accuracy to 0.5 points; measured differences are ~3e-8 (float
reassociation in the batched matmuls).
"""

from __future__ import annotations

import logging

import pytest
import torch

from fedhet.config import ExperimentConfig
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def config(method: str, mode: str, split: str = "dirichlet-per-client", **train) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", split, 6
    cfg.data.split_params = {"alpha": 1.0} if split == "dirichlet-per-client" else {"samples_per_client": 150}
    cfg.model.name = "mlp"
    cfg.train.rounds, cfg.train.lr = 3, 0.1
    for key, value in train.items():
        setattr(cfg.train, key, value)
    cfg.eval.fairness = False
    cfg.method.name = method
    cfg.engine.mode = mode
    return cfg


def run_both(method: str, params: dict | None = None, **kw):
    out = []
    for mode in ("sequential", "vectorized"):
        cfg = config(method, mode, **kw)
        cfg.method.params = dict(params or {})
        sim = make_simulation(cfg)
        sim.run()
        out.append((sim.strategy.global_model().state_dict(), sim.history, sim))
    return out


CASES = {
    # momentum, weight decay, Nesterov and clipping all at once; unequal client sizes (unequal step counts)
    "fedavg": ("fedavg", {}, dict(momentum=0.9, weight_decay=1e-3, nesterov=True, grad_clip=1.0)),
    "fedprox": ("fedprox", {"mu": 1.0}, dict(momentum=0.5)),
    # CLA: client i holds classes 0..k_i only, so FedRS's scales differ from 1
    "fedrs": ("fedrs", {"fedrs_alpha": 0.1}, dict(split="cla")),
    "celm": ("celm", {"warmup_fraction": 0.34, "probe_steps": 5}, {}),  # warm-up keeps the head local
}


@pytest.mark.parametrize("case", CASES)
def test_vectorized_training_matches_the_sequential_engine(case):
    method, params, kw = CASES[case]
    (seq_w, seq_h, seq), (vec_w, vec_h, vec) = run_both(method, params, **kw)
    assert vec.transport.vector_refusal == ""  # it did run vectorized
    for key in seq_w:
        torch.testing.assert_close(vec_w[key], seq_w[key], atol=1e-5, rtol=0)
    for a, b in zip(seq_h, vec_h, strict=True):
        assert abs(a["accuracy"] - b["accuracy"]) <= 0.005
    # every client took exactly its own number of steps, as in the sequential run
    seq_states = {c: s.weights for c, s in seq.client_states.items()}
    vec_states = {c: s.weights for c, s in vec.client_states.items()}
    assert seq_states.keys() == vec_states.keys()
    for cid, kept in seq_states.items():
        if kept is None:
            assert vec_states[cid] is None
        else:
            for key in kept:
                torch.testing.assert_close(vec_states[cid][key], kept[key], atol=1e-5, rtol=0)


def test_a_training_change_the_vectorized_path_misses_is_caught():
    """The comparison above is sensitive: an lr 0.1 % off in one mode moves the weights beyond 1e-5."""
    seq = make_simulation(config("fedavg", "sequential"))
    seq.run()
    other = config("fedavg", "vectorized")
    other.train.lr = 0.1001
    vec = make_simulation(other)
    vec.run()
    a, b = seq.strategy.global_model().state_dict(), vec.strategy.global_model().state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) > 1e-5  # beyond the tolerance used above


def test_vectorized_refuses_what_it_cannot_honour_naming_the_reason_and_auto_falls_back(caplog):
    with pytest.raises(ConfigError, match="train.optimizer = 'adam'"):
        make_simulation(config("fedavg", "vectorized", optimizer="adam")).run()
    cfg = config("fedrac", "vectorized")
    cfg.data.validation_fraction, cfg.model.name = 0.1, "mlp200"
    with pytest.raises(ConfigError, match="submodel masks"):
        make_simulation(cfg).run()
    cfg = config("fedavg", "vectorized")
    cfg.faults.clients = {"0": "noise"}
    with pytest.raises(ConfigError, match=r"\[faults\]"):
        make_simulation(cfg).run()
    # auto: the same run, trained sequentially, with the reason logged
    with caplog.at_level(logging.INFO, logger="fedhet"):
        auto = make_simulation(config("fedavg", "auto", optimizer="adam"))
        auto.run()
    assert "training sequentially because train.optimizer = 'adam'" in caplog.text
    seq = make_simulation(config("fedavg", "sequential", optimizer="adam"))
    seq.run()
    assert [h["accuracy"] for h in auto.history] == [h["accuracy"] for h in seq.history]
