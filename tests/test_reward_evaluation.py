"""The accuracies of many weight sets of one architecture in one batched pass (``accuracies_of_states``, the
own-model methods' reward evaluation): equal to each model evaluated alone by a plain loop, state by state
(never mixed up), with BatchNorm in eval mode, with a fallback for models vmap cannot batch, and through
``evaluate_rewards`` with its deduplication of equal rewards."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedhet.engine.evaluation as evaluation
from fedhet.engine.evaluation import accuracies_of_states
from fedhet.models import build_model


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1,797 handwritten digits (8 x 8, scaled to [0, 1]) and labels: real data."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(bunch.target, dtype=torch.long)


@pytest.fixture
def batched(monkeypatch):
    """Force the stacked path (the default takes it on accelerators only)."""
    monkeypatch.setattr(evaluation, "_BATCHED_STATES", True)


def trained_states(x, y, count: int, name: str = "mlp200", **params) -> tuple[nn.Module, list[dict]]:
    """``count`` models of one architecture trained for different numbers of steps on different samples,
    so their accuracies on (x, y) differ (from near chance to well trained)."""
    model = build_model(name, (1, 8, 8), 10, **params)
    states = []
    for i in range(count):
        torch.manual_seed(i)
        m = build_model(name, (1, 8, 8), 10, **params)
        opt = torch.optim.SGD(m.parameters(), lr=0.3)
        gen = torch.Generator().manual_seed(100 + i)
        for _ in range(8 * i):
            idx = torch.randint(0, 1000, (32,), generator=gen)
            opt.zero_grad()
            F.cross_entropy(m(x[idx]), y[idx]).backward()
            opt.step()
        states.append({k: v.detach().clone() for k, v in m.state_dict().items()})
    return model, states


def plain_loop(model: nn.Module, states, x, y) -> tuple[np.ndarray, np.ndarray]:
    """Each state alone: model(x).argmax (an independent computation); and per state the number of samples
    whose top two logits lie within 1e-4, where a different kernel may flip the argmax."""
    m = copy.deepcopy(model).eval()
    accs, ties = [], []
    with torch.no_grad():
        for state in states:
            m.load_state_dict(state)
            logits = m(x)
            accs.append(float((logits.argmax(1) == y).float().mean()))
            top2 = logits.topk(2, dim=1).values
            ties.append(int((top2[:, 0] - top2[:, 1] < 1e-4).sum()))
    return np.array(accs), np.array(ties)


def assert_agree(fast, states, model, x, y) -> None:
    """The stacked products and the loop's add float32 terms in different orders (differences O(1e-6) on
    logits of O(1-10)), so an argmax may flip only where a sample's top two logits tie within that: per state
    at most that many samples may differ (0 on most machines), nowhere else."""
    loop, ties = plain_loop(model, states, x, y)
    flipped = np.rint(np.abs(np.array(fast) - loop) * len(y))
    assert (flipped <= ties).all(), (np.array(fast) - loop, ties)


@pytest.mark.numerics
@pytest.mark.parametrize("rows", [1 << 14, 700])  # one group of all states; groups of 2 (700 // 300)
def test_stacked_accuracies_equal_each_model_evaluated_alone(digits, batched, monkeypatch, rows):
    x, y = digits
    model, states = trained_states(x, y, 6, hidden_size=64)
    monkeypatch.setattr(evaluation, "_STACKED_ROWS", rows)
    fast = accuracies_of_states(model, states, x, y, batch_size=300)  # 1,797 = 5 x 300 + 297: a short batch
    assert len(np.unique(fast)) >= 5 and max(fast) - min(fast) > 0.3  # distinct: not constants compared
    assert_agree(fast, states, model, x, y)


def test_stacking_never_mixes_the_states_up(digits, batched):
    """Swapping two states swaps their accuracies (a batched pass that paired weights with the wrong slot,
    or evaluated one state for all, fails here: the two differ by far more than a near-tie)."""
    x, y = digits
    model, states = trained_states(x, y, 6, hidden_size=64)
    before = accuracies_of_states(model, states, x, y, 512)
    assert abs(before[0] - before[5]) > 0.3
    swapped = [states[5], *states[1:5], states[0]]
    after = accuracies_of_states(model, swapped, x, y, 512)
    assert after == [before[5], *before[1:5], before[0]]
    assert_agree(after, swapped, model, x, y)


@pytest.mark.numerics
def test_stacked_accuracies_use_each_states_batchnorm_statistics(digits, batched):
    """BatchNorm runs in eval mode on each state's own running statistics (a model in training mode is
    evaluated in eval mode and left in training mode)."""
    x, y = digits[0][:256].expand(-1, 3, -1, -1), digits[1][:256]
    torch.manual_seed(0)
    model = build_model("resnet8", (3, 8, 8), 10)
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    states = []
    for i in range(4):
        state = {k: v.clone() for k, v in model.state_dict().items()}
        gen = torch.Generator().manual_seed(i)
        for k, v in state.items():
            if k.endswith("running_mean"):
                v.normal_(0.0, 0.5, generator=gen)
            elif k.endswith("running_var"):
                v.uniform_(0.5, 2.0, generator=gen)
        states.append(state)
    model.train()
    fast = accuracies_of_states(model, states, x, y, 100)
    assert model.training
    assert len(np.unique(fast)) >= 2  # the statistics matter: the states are told apart
    assert_agree(fast, states, model, x, y)


class ItemModel(nn.Module):
    """A model vmap cannot batch: its forward reads a weight's value into Python (``.item()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x.flatten(1)) * (2.0 if self.fc.bias[0].item() > 0 else 1.0)


def test_a_model_vmap_cannot_batch_is_evaluated_one_state_at_a_time(digits, batched, caplog):
    x, y = digits
    states = []
    for i in range(3):
        torch.manual_seed(i)
        states.append(ItemModel().state_dict())
    with caplog.at_level(logging.INFO, logger="fedhet.engine.evaluation"):
        fast = accuracies_of_states(ItemModel(), states, x, y, 512)
    assert any("one state at a time" in r.getMessage() for r in caplog.records)
    assert fast == plain_loop(ItemModel(), states, x, y)[0].astype(np.float32).tolist()


def test_the_default_stacks_on_an_accelerator_only(digits, monkeypatch):
    """On CPU the states go one at a time (measured faster there: benchmarks/fedrac_row.py), with the
    loop's own kernels, so the numbers equal the loop's exactly."""
    x, y = digits
    model, states = trained_states(x, y, 3, hidden_size=32)
    stacked = []
    monkeypatch.setattr(evaluation, "_stacked_correct", lambda *a: stacked.append(1))
    out = accuracies_of_states(model, states, x, y, 512)
    assert stacked == [] and out == plain_loop(model, states, x, y)[0].astype(np.float32).tolist()


@pytest.mark.numerics
@pytest.mark.parametrize("method", ["iafl", "cffl", "fedavg"])
def test_evaluate_rewards_stacked_equals_each_reward_alone(method, batched, monkeypatch):
    """Through the strategy: the distinct rewards go in one pass (IAFL's equal ones once) and each client
    gets its own reward's accuracy."""
    from fedhet.algorithms import fedavg as fedavg_module
    from fedhet.experiment import make_simulation
    from test_fairness_baselines import small_config

    sim = make_simulation(small_config(method, train__rounds=2))
    sim.run()
    st = sim.strategy
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(300, 1, 28, 28, generator=gen), torch.randint(0, 10, (300,), generator=gen)
    rewards = [{k: v.clone() for k, v in st.reward_model(c).state_dict().items()} for c in range(4)]
    handed = []
    counted = fedavg_module.accuracies_of_states
    monkeypatch.setattr(
        fedavg_module, "accuracies_of_states", lambda m, s, *a: handed.append(len(s)) or counted(m, s, *a)
    )
    got = st.evaluate_rewards(x, y, 128)
    distinct = []
    for r in rewards:
        if not any(all(torch.equal(r[k], d[k]) for k in r) for d in distinct):
            distinct.append(r)
    assert handed == [len(distinct)] and (len(distinct) < 4) == (method == "iafl")
    assert_agree(got, rewards, st.reward_model(0), x, y)
