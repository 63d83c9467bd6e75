"""FedSAC re-implementation (baselines.md §2.6): unit importance, importance-ordered nested submodels with a
fixed ratio, shared masked aggregation, checkpoints and an end-to-end run."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedhet.algorithms import build_strategy
from fedhet.algorithms.allocation import sharpen_contributions
from fedhet.algorithms.fedsac import FedSAC, unit_importance
from fedhet.algorithms.submodel import SubmodelStrategy
from fedhet.config import ExperimentConfig
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from fedhet.models import build_model
from fedhet.models.masks import nested_prefix_masks

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
STANDALONE = np.array([0.55, 0.20, 0.41, 0.33, 0.48])


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


@pytest.fixture(scope="module")
def fashion() -> tuple[torch.Tensor, torch.Tensor]:
    if not (FASHION_DIR / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("Fashion-MNIST idx files missing (apt-get install dataset-fashion-mnist)")
    x = torch.from_numpy(_read_idx(FASHION_DIR / "train-images-idx3-ubyte.gz")[:2500].copy()).float()
    y = torch.from_numpy(_read_idx(FASHION_DIR / "train-labels-idx1-ubyte.gz")[:2500].astype(np.int64))
    return ((x / 255.0 - 0.286) / 0.353).unsqueeze(1), y


def _loop_importance(model, x, y) -> torch.Tensor:
    """Leave-one-out by brute force: validation loss with each unit masked minus the full model's."""
    with torch.no_grad():
        base = F.cross_entropy(model(x), y)
        out = []
        for unit in range(model.maskable_units):
            mask = torch.ones(model.maskable_units)
            mask[unit] = 0
            model.set_mask(mask)
            out.append(F.cross_entropy(model(x), y) - base)
        model.set_mask(None)
    return torch.stack(out)


@pytest.mark.numerics
def test_mlp_importance_equals_brute_force_leave_one_out(fashion):
    x, y = fashion
    torch.manual_seed(0)
    model = build_model("mlp200", (1, 28, 28), 10, hidden_size=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(40):
        idx = torch.arange(step * 50, step * 50 + 50) % 2000
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    model.eval()
    vx, vy = x[2000:], y[2000:]
    fast = unit_importance(model, vx, vy)
    brute = _loop_importance(model, vx, vy)
    torch.testing.assert_close(fast, brute, rtol=1e-4, atol=1e-6)
    assert fast.shape == (32,) and fast.max() > 1e-3  # some unit matters


@pytest.mark.numerics
def test_generic_importance_on_resnet18gn_equals_brute_force():
    torch.manual_seed(1)
    model = build_model("resnet18gn", (3, 32, 32), 10, stem="cifar", width=8).eval()
    x, y = torch.randn(6, 3, 32, 32), torch.randint(0, 10, (6,))
    torch.testing.assert_close(
        unit_importance(model, x, y, batch_size=4), _loop_importance(model, x, y), rtol=1e-4, atol=1e-5
    )


def small_config(**params) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "cla", 5
    cfg.data.split_params = {"samples_per_client": 200}
    cfg.data.validation_fraction = 0.1
    cfg.data.max_train_samples, cfg.data.max_test_samples = 4000, 500
    cfg.model.name, cfg.model.params = "mlp200", {"hidden_size": 24}
    cfg.train.rounds, cfg.train.local_steps, cfg.train.batch_size = 5, 5, 32
    cfg.train.lr, cfg.train.grad_clip = 0.1, 1.0
    cfg.method.name, cfg.method.params = "fedsac", {"importance_samples": 200, **params}
    cfg.eval.every, cfg.eval.checkpoint_every = 2, 1
    return cfg


def test_fedsac_masks_are_importance_prefixes_sized_by_contribution():
    sim = make_simulation(small_config(importance_every=2), reference_contributions=STANDALONE)
    sim.setup()
    strat = sim.strategy
    assert isinstance(strat, SubmodelStrategy) and strat.threshold_ratio(3) == 0.4
    np.testing.assert_allclose(strat.sharpened, sharpen_contributions(STANDALONE, 80.0))
    recomputed = []
    for rnd in range(1, 6):
        previous = None if strat.importance is None else strat.importance.clone()
        sim.train_round(rnd)
        if rnd == 1:
            assert torch.all(strat.masks == 1) and strat.importance is None
            continue
        if previous is None or not torch.equal(previous, strat.importance):
            recomputed.append(rnd)
        order = torch.argsort(-strat.importance, stable=True)
        sizes = strat.masks.sum(1).long()
        for cid in range(5):
            assert torch.equal(strat.masks[cid], nested_prefix_masks(order, [int(sizes[cid])], 48)[0])
        ranked = np.argsort(STANDALONE, kind="stable")
        assert int(sizes[ranked[-1]]) == 48
        assert all(int(sizes[a]) <= int(sizes[b]) for a, b in zip(ranked[:-1], ranked[1:], strict=True))
        # the most important units are in every client's submodel
        assert torch.all(strat.masks[:, order[: int(sizes.min())]] == 1)
    assert recomputed == [2, 4]  # importance_every = 2


def test_fedsac_resume_and_state_round_trip(tmp_path):
    cfg = small_config(importance_every=3)
    make_simulation(cfg, run_dir=tmp_path / "full", reference_contributions=STANDALONE).run()

    class Stop(Exception):
        pass

    def stop_at_4(rnd, total, line):
        if rnd == 4:
            raise Stop

    with pytest.raises(Stop):
        make_simulation(
            cfg, run_dir=tmp_path / "cut", progress=stop_at_4, reference_contributions=STANDALONE
        ).run()
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "round_00004")
    make_simulation(cfg, run_dir=tmp_path / "cut", resume=True, reference_contributions=STANDALONE).run()
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == (
        tmp_path / "full" / "metrics.jsonl"
    ).read_text()
    sim = make_simulation(cfg, reference_contributions=STANDALONE)
    sim.setup()
    for rnd in (1, 2, 3):
        sim.train_round(rnd)
    other = make_simulation(cfg, reference_contributions=STANDALONE)
    other.setup()
    other.strategy.load_state_dict(sim.strategy.state_dict())
    assert torch.equal(other.strategy.importance, sim.strategy.importance)
    assert other.strategy.importance_round == 2 and torch.equal(other.strategy.masks, sim.strategy.masks)


def test_fedsac_end_to_end_run_is_labelled_a_reimplementation(tmp_path):
    assert "re-implementation" in FedSAC.__doc__ and "re-implementation" in FedSAC.label
    cfg = small_config()
    cfg.data.clients = 4
    cfg.data.split_params = {"samples_per_client": 300}
    summary = make_simulation(cfg, run_dir=tmp_path / "run").run()  # standalone computed by the engine
    assert summary["final"]["accuracy"] > 0.3
    assert {"fairness_pearson", "bcf_rate", "bcf_rate_code"} <= set(summary["final"])
    assert (tmp_path / "run" / "figures" / "rewards_vs_standalone.png").stat().st_size > 1000
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [ln["mask_sizes"][int(np.argmax(summary["standalone"]))] for ln in lines] == [48] * 5


def test_fedsac_parameters_are_validated():
    with pytest.raises(ConfigError, match="fixed_ratio"):
        build_strategy("fedsac", {"fixed_ratio": -0.1})
    with pytest.raises(ConfigError, match="importance_every"):
        build_strategy("fedsac", {"importance_every": 0})
    with pytest.raises(ConfigError, match="no parameter"):
        build_strategy("fedsac", {"reputation_ratio": 0.2})
    assert type(build_strategy("fedsac")) is FedSAC
