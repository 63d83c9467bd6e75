"""engine.mode = "vectorized": the round's clients trained at once give the sequential engine's results.

Tolerance (stated in docs/performance.md): after 3 rounds every global weight within 1e-5 of the
sequential run's, and the same test accuracy to 0.5 points; measured differences are ~3e-8 (float
reassociation in the batched matmuls).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from fedhet.config import ExperimentConfig
from fedhet.engine import vectorized
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def config(
    method: str, mode: str, split: str = "dirichlet-per-client", model: str = "mlp", **train
) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", split, 6
    cfg.data.split_params = {"alpha": 1.0} if split == "dirichlet-per-client" else {"samples_per_client": 150}
    cfg.model.name = model
    if model == "mlp200" or train.pop("validation", False):  # a server validation set (FedRAC, CFFL)
        cfg.data.validation_fraction = 0.1
    cfg.train.rounds, cfg.train.lr = 3, 0.1
    for key, value in train.items():
        setattr(cfg.train, key, value)
    cfg.eval.fairness = False
    cfg.method.name = method
    cfg.engine.mode = mode
    return cfg


def run_both(method: str, params: dict | None = None, **kw):
    """The method in both engine modes. FedRAC's and FedSAC's reference accuracies are given (not a
    standalone pre-pass, which the engine mode keys apart and which would train maskless members here)."""
    out = []
    for mode in ("sequential", "vectorized"):
        cfg = config(method, mode, **kw)
        cfg.method.params = dict(params or {})
        reference = np.linspace(0.5, 0.9, cfg.data.clients) if method in ("fedrac", "fedsac") else None
        sim = make_simulation(cfg, reference_contributions=reference)
        sim.run()
        out.append((sim.strategy.global_model().state_dict(), sim.history, sim))
    return out


CASES = {
    # momentum, weight decay, Nesterov and clipping all at once; unequal client sizes (unequal step counts)
    "fedavg": ("fedavg", {}, dict(momentum=0.9, weight_decay=1e-3, nesterov=True, grad_clip=1.0)),
    # SGD clipped, or with weight decay, and nothing else: the closed form, not fused with the step
    "fedavg-clip": ("fedavg", {}, dict(grad_clip=0.5)),
    "fedavg-decay": ("fedavg", {}, dict(weight_decay=0.05)),
    "fedprox": ("fedprox", {"mu": 1.0}, dict(momentum=0.5)),
    # CLA: client i holds classes 0..k_i only, so FedRS's scales differ from 1
    "fedrs": ("fedrs", {"fedrs_alpha": 0.1}, dict(split="cla")),
    "celm": ("celm", {"warmup_fraction": 0.34, "probe_steps": 5}, {}),  # warm-up keeps the head local
    # every client trains its own submodel of mlp200 (a different 0/1 mask per client), clipped as FedRAC's
    # command line does; FedSAC's masks with momentum (the unfused closed form)
    "fedrac": ("fedrac", {}, dict(model="mlp200", grad_clip=1.0)),
    "fedsac": ("fedsac", {}, dict(model="mlp200", momentum=0.5)),
    # the own-model trainer: FedAvg's loop, its own reply (clipped, top-θ Δ) and kept model
    "cffl": ("cffl", {}, dict(validation=True)),
    "cgsv": ("cgsv", {}, {}),
}
MASKED = {"fedrac", "fedsac"}


@pytest.mark.numerics
@pytest.mark.parametrize("gradients", ["auto", "vmap"])
@pytest.mark.parametrize("case", CASES)
def test_vectorized_training_matches_the_sequential_engine(case, gradients, monkeypatch):
    """Both ways of computing the group's gradients: "auto" takes the closed form for the ReLU-stack MLP
    (fused with the step when the SGD is plain: FedRS, CELM), except under FedProx's term; "vmap" never."""
    monkeypatch.setattr(vectorized, "GRADIENTS", gradients)
    method, params, kw = CASES[case]
    if case in MASKED and gradients == "vmap":
        pytest.skip("submodel masks train on the closed form only (the refusal is tested below)")
    calls = []  # (lr, masks) of every closed-form step
    step = vectorized.relu_stack_step
    monkeypatch.setattr(
        vectorized,
        "relu_stack_step",
        lambda *a: calls.append((a[5], a[6] if len(a) > 6 else None)) or step(*a),
    )
    (seq_w, seq_h, seq), (vec_w, vec_h, vec) = run_both(method, params, **kw)
    assert vec.transport.vector_refusal == ""  # it did run vectorized
    assert bool(calls) == (gradients == "auto" and case != "fedprox")
    if case in MASKED:  # every step got the members' masks, and they are not all the whole model
        assert all(masks is not None for _, masks in calls)
        assert any(float(m.min()) == 0.0 for _, masks in calls for m in masks)
    elif calls:  # fused (an lr passed) exactly where the SGD is plain
        assert all(lr is None for lr, _ in calls) == case.startswith("fedavg")
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


def test_vectorized_refuses_what_it_cannot_honour_naming_the_reason_and_auto_falls_back(caplog, monkeypatch):
    # SAGE's trainer is FixMatch's (its own batches and loss): training hooks, so refused by name
    with pytest.raises(ConfigError, match="SAGETrainer has hooks the vectorized path cannot honour"):
        make_simulation(config("sage", "vectorized")).run()
    with pytest.raises(ConfigError, match="train.optimizer = 'adam'"):
        make_simulation(config("fedavg", "vectorized", optimizer="adam")).run()
    with monkeypatch.context() as patch:  # masks need the closed form, which "vmap" turns off
        patch.setattr(vectorized, "GRADIENTS", "vmap")
        with pytest.raises(ConfigError, match="submodel masks"):
            make_simulation(config("fedrac", "vectorized", model="mlp200")).run()
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


class _Scale(torch.nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


@pytest.mark.numerics
def test_the_closed_form_relu_stack_step_equals_autograd_member_by_member():
    """relu_stack_step against torch.autograd on each member's own nn.Sequential (an independent
    computation): losses, every gradient, and the fused SGD step, with padding, an idle member, FedRS
    scales and submodel masks."""
    gen = torch.Generator().manual_seed(0)
    group, batch, widths, classes = 4, 5, [12, 7, 6], 3
    dims = [widths[0], *widths[1:], classes]
    layers = [
        (torch.randn(group, b, a, generator=gen), torch.randn(group, b, generator=gen))
        for a, b in zip(dims[:-1], dims[1:], strict=True)
    ]
    x = torch.randn(group, batch, 3, 2, 2, generator=gen)  # flattened to 12 features
    y = torch.randint(0, classes, (group, batch), generator=gen)
    w = torch.ones(group, batch)
    w[1, 3:] = 0.0  # a short last batch
    w[2] = 0.0  # a member past its last step
    w[3, 1:] = 0.0  # one real sample
    scales = torch.rand(group, classes, generator=gen) + 0.5
    # submodel masks: one 0/1 (group, width) per hidden layer, a masked unit's ReLU output multiplied by 0
    masks = [(torch.rand(group, width, generator=gen) > 0.4).float() for width in widths[1:]]
    for scale, mask in ((None, None), (scales, None), (None, masks)):
        losses, grads = vectorized.relu_stack_step(layers, x, y, w, scale, None, mask)
        for g in range(group):
            net = torch.nn.Sequential(torch.nn.Flatten())
            for i, (weight, bias) in enumerate(layers):
                linear = torch.nn.Linear(weight.shape[2], weight.shape[1])
                linear.weight.data, linear.bias.data = weight[g].clone(), bias[g].clone()
                net.append(linear)
                if i < len(layers) - 1:
                    net.append(torch.nn.ReLU())
                    if mask is not None:  # the unit mask as MaskedMLP's UnitMask multiplies it in
                        net.append(_Scale(mask[i][g]))
            real = w[g] > 0
            logits = net(x[g][real]) * (1.0 if scale is None else scale[g])
            loss = torch.nn.functional.cross_entropy(logits, y[g][real]) if real.any() else logits.sum() * 0
            loss.backward()
            torch.testing.assert_close(losses[g], loss.detach(), atol=1e-5, rtol=1e-5)
            linears = [m for m in net if isinstance(m, torch.nn.Linear)]
            for (gw, gb), linear in zip(grads, linears, strict=True):
                expected_w = linear.weight.grad if linear.weight.grad is not None else torch.zeros_like(gw[g])
                torch.testing.assert_close(gw[g], expected_w, atol=1e-5, rtol=1e-5)
                expected_b = linear.bias.grad if linear.bias.grad is not None else torch.zeros_like(gb[g])
                torch.testing.assert_close(gb[g], expected_b, atol=1e-5, rtol=1e-5)
        # fused: the same step taken inside the products, the idle member untouched
        stepped = [(weight.clone(), bias.clone()) for weight, bias in layers]
        vectorized.relu_stack_step(stepped, x, y, w, scale, 0.3, mask)
        for (weight, bias), (new_w, new_b), (gw, gb) in zip(layers, stepped, grads, strict=True):
            torch.testing.assert_close(new_w, weight - 0.3 * gw, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(new_b, bias - 0.3 * gb, atol=1e-6, rtol=1e-6)
            assert torch.equal(new_w[2], weight[2]) and torch.equal(new_b[2], bias[2])


def test_the_engine_reads_a_trainers_declared_form_and_refuses_an_overridden_hook_by_name():
    """A trainer vectorizes by the functional form its class declares (``Trainer.functional_form``), only
    while it keeps the declaring class's training hooks; the refusal names the hook that was overridden."""
    from fedhet.algorithms.fedavg import SGDTrainer
    from fedhet.algorithms.fedrs import FedRSTrainer

    class DoubledLoss(SGDTrainer):
        def loss(self, u, batch):
            return 2.0 * super().loss(u, batch)

    class Redeclared(FedRSTrainer):  # declares the form it inherits, hooks unchanged
        functional_form = "restricted"

    class OptedOut(SGDTrainer):
        functional_form = None

    class OwnReply(SGDTrainer):
        def finish(self, u, metrics):
            return super().finish(u, metrics)

    model, train = torch.nn.Linear(4, 3), ExperimentConfig().train
    reason = vectorized.why_not_vectorized(DoubledLoss(), model, train)
    assert reason is not None
    assert "DoubledLoss has hooks the vectorized path cannot honour" in reason
    assert "overrides `loss` below SGDTrainer's declared 'plain' form" in reason
    assert vectorized.trainer_kind(DoubledLoss()) is None
    assert vectorized.why_not_vectorized(Redeclared(), model, train) is None
    assert vectorized.trainer_kind(Redeclared()) == "restricted"
    assert "OptedOut declares no functional form" in vectorized.why_not_vectorized(OptedOut(), model, train)
    # the plain-reply shortcut holds only for the declaring class's own finish
    assert vectorized.replies_trained_weights(SGDTrainer())
    assert vectorized.replies_trained_weights(Redeclared())
    assert not vectorized.replies_trained_weights(OwnReply())
