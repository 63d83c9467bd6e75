"""Data-free FedRAC (docs/data-free-fairness.md): reputations from CELM's evidence, candidates scored on
inputs grown from the global model, and the guarantee that such a run never sees the validation set or the
standalone accuracies. Known answers are computed here by hand or by independent code."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedhet.algorithms import build_strategy
from fedhet.algorithms.allocation import (
    evidence_coverage,
    masked_accuracies,
    relative_reputation,
    relative_scores,
)
from fedhet.algorithms.fedrac import dynamic_ratio
from fedhet.algorithms.logit_probes import grow_class_inputs
from fedhet.config import ExperimentConfig
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from fedhet.models import build_model
from fedhet.models.masks import nested_prefix_masks

#: Standalone accuracies handed to the engine, for the fairness metrics only (client 3 the best).
STANDALONE = np.array([0.30, 0.62, 0.45, 0.70, 0.30])


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def small_config(method: str = "fedrac-data-free", rounds: int = 6, **params) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "cla", 5
    cfg.data.split_params = {"samples_per_client": 200}
    cfg.data.validation_fraction = 0.1
    cfg.data.max_train_samples, cfg.data.max_test_samples = 4000, 500
    cfg.model.name, cfg.model.params = "mlp200", {"hidden_size": 24}  # K = 48 units, step 8: 6 candidates
    cfg.train.rounds, cfg.train.local_steps, cfg.train.batch_size = rounds, 3, 32
    cfg.train.lr, cfg.train.grad_clip = 0.05, 1.0
    cfg.method.name = method
    cfg.method.params = {"contribution_warmup": 0.5, "score_per_class": 4, **params}
    cfg.eval.every, cfg.eval.checkpoint_every = 1, 1
    return cfg


def _lines(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------------------------------------
# Formulas (known answers by hand)
# --------------------------------------------------------------------------------------------------------
def test_evidence_coverage_known_answers():
    raw = np.array(
        [
            [10.0, 0.0, -5.0],  # max 10: (1 + 0 + 0)/3
            [4.0, 8.0, 2.0],  # max 8: (0.5 + 1 + 0.25)/3
            [-1.0, -2.0, -3.0],  # no positive evidence: 0
            [3.0, 3.0, 3.0],  # flat: 1
        ]
    )
    np.testing.assert_allclose(evidence_coverage(raw), [1 / 3, 1.75 / 3, 0.0, 1.0], rtol=1e-15)
    # Each row is measured against its own maximum: scaling one model's logits changes nothing.
    scaled = raw.copy()
    scaled[1] *= 100.0
    np.testing.assert_allclose(evidence_coverage(scaled), evidence_coverage(raw), rtol=1e-15)


def test_relative_reputation_and_scores_known_answers():
    np.testing.assert_allclose(relative_reputation(np.array([0.2, 0.5, 0.4])), [0.4, 1.0, 0.8])
    assert relative_reputation(np.zeros(3)).tolist() == [1.0, 1.0, 1.0]  # nobody positive: all level
    np.testing.assert_allclose(relative_scores(np.array([0.1, 0.3, 0.6])), [1 / 6, 0.5, 1.0])
    assert relative_scores(np.array([0.2, 0.0])).tolist() == [0.2, 0.0]  # a full model at 0: unchanged


# --------------------------------------------------------------------------------------------------------
# The grown inputs
# --------------------------------------------------------------------------------------------------------
@pytest.mark.numerics
def test_grown_inputs_match_an_independent_per_input_adam_loop():
    """Each input follows torch.optim.Adam(maximize=True) on s_c(x) − λ‖x‖² from its own start point, and
    the copies kept are the iterates after the listed step counts (a second implementation)."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)
    )
    per_class, depths, lr, l2 = 2, (1, 3, 4), 0.1, 0.01
    x, y = grow_class_inputs(
        model,
        (1, 2, 3),
        3,
        per_class=per_class,
        depths=depths,
        lr=lr,
        l2=l2,
        init_scale=0.7,
        generator=torch.Generator().manual_seed(11),
    )
    assert x.shape == (len(depths) * per_class * 3, 1, 2, 3) and y.tolist() == [0, 1, 2] * 6
    start = 0.7 * torch.randn((per_class * 3, 1, 2, 3), generator=torch.Generator().manual_seed(11))
    for row in range(per_class * 3):
        cls = row % 3
        xi = start[row : row + 1].clone().requires_grad_(True)
        opt = torch.optim.Adam([xi], lr=lr, maximize=True)
        for step in range(1, 5):
            opt.zero_grad()
            (model(xi)[0, cls] - l2 * xi.pow(2).sum()).backward()
            opt.step()
            if step in depths:
                kept = x[depths.index(step) * per_class * 3 + row]
                torch.testing.assert_close(kept, xi.detach()[0], rtol=1e-5, atol=1e-6)
    assert model.training  # the caller's mode is restored


def test_grown_inputs_reject_empty_or_non_positive_depths():
    model = torch.nn.Linear(4, 2)
    for depths in ([], [0, 2]):
        with pytest.raises(ConfigError, match="depths"):
            grow_class_inputs(model, (4,), 2, per_class=1, depths=depths)
    for bad in ([], [0], "123", [1.5]):
        with pytest.raises(ConfigError, match="score_depths"):
            build_strategy("fedrac-data-free", {"score_depths": bad})
    with pytest.raises(ConfigError, match="contributions"):
        build_strategy("fedrac", {"contributions": "shapley"})
    with pytest.raises(ConfigError, match="candidate_score"):
        build_strategy("fedrac", {"candidate_score": "test-set"})


def _trained_mlp(x, y, steps=150):
    torch.manual_seed(0)
    model = build_model("mlp200", (1, 28, 28), 10, hidden_size=64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, len(y), (64,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return model.eval()


def test_the_probe_score_follows_validation_accuracy_on_real_data():
    """The design claim: across nested candidates of a trained mlp200, the relative accuracy on grown inputs
    tracks the real held-out accuracy (relative to the full model's). Fashion-MNIST, 3,000 images."""
    from fedhet.data.datasets import load_dataset

    try:
        ds = load_dataset("fashion-mnist")
    except Exception as exc:  # noqa: BLE001 (the Debian package is missing)
        pytest.skip(f"Fashion-MNIST unavailable: {exc}")
    x, y = ds.normalize(ds.train_x[:3000]), ds.train_y[:3000]
    model = _trained_mlp(x[:2000], y[:2000])
    order = torch.randperm(128, generator=torch.Generator().manual_seed(2))
    masks = nested_prefix_masks(order, list(range(8, 129, 8)), 128)
    real = masked_accuracies(model, x[2000:], y[2000:], masks)
    gx, gy = grow_class_inputs(
        model,
        (1, 28, 28),
        10,
        per_class=20,
        depths=range(1, 9),  # the strategy's defaults: the first 8 iterates at lr 0.2
        lr=0.2,
        generator=torch.Generator().manual_seed(4),
    )
    probe = relative_scores(masked_accuracies(model, gx, gy, masks))
    assert probe[-1] == 1.0 and real[-1] > 0.6
    assert np.corrcoef(probe, real / real[-1])[0, 1] > 0.9
    assert np.abs(probe - real / real[-1]).mean() < 0.15  # close in value, not only correlated


# --------------------------------------------------------------------------------------------------------
# The inputs a data-free run receives
# --------------------------------------------------------------------------------------------------------
def test_the_options_set_what_the_method_requires():
    cases = {
        ("standalone", "validation"): {"validation", "reference_contributions"},
        ("celm", "validation"): {"validation"},
        ("standalone", "probe"): {"reference_contributions"},
        ("celm", "probe"): set(),
    }
    for (contributions, score), needs in cases.items():
        strategy = build_strategy("fedrac", {"contributions": contributions, "candidate_score": score})
        assert strategy.requirements() == needs
        assert ("data.validation_fraction" in strategy.config_defaults()) == ("validation" in needs)
        assert ("head" in strategy.model_needs) == (contributions == "celm")
    assert build_strategy("fedrac-data-free").requirements() == frozenset()


def test_a_data_free_run_never_sees_the_validation_set_or_the_standalone_accuracies(tmp_path):
    """The run holds both (fairness is evaluated against the standalone accuracies), the strategy neither."""
    sim = make_simulation(
        small_config(rounds=4), run_dir=tmp_path / "free", reference_contributions=STANDALONE
    )
    summary = sim.run()
    assert sim.fed.validation is not None and sim.strategy.info.validation is None
    assert sim.strategy.info.reference_contributions is None
    assert summary["standalone"] == pytest.approx(STANDALONE.tolist())
    assert math.isfinite(summary["final"]["fairness_pearson"])
    paper = make_simulation(small_config("fedrac", rounds=2), reference_contributions=STANDALONE)
    paper.run()
    assert paper.strategy.info.validation is not None
    np.testing.assert_array_equal(paper.strategy.info.reference_contributions, STANDALONE)


# --------------------------------------------------------------------------------------------------------
# The round: estimation with kept heads, then allocation in relative units
# --------------------------------------------------------------------------------------------------------
def _coverage_by_hand(raw_rows: list[list[float]]) -> list[float]:
    out = []
    for row in raw_rows:
        top = max(max(v, 0.0) for v in row)
        out.append(0.0 if top <= 0 else sum(max(v, 0.0) / top for v in row) / len(row))
    return out


def test_estimation_rounds_keep_heads_then_allocation_uses_relative_reputations(tmp_path):
    run = tmp_path / "run"
    sim = make_simulation(small_config(rounds=6), run_dir=run, reference_contributions=STANDALONE)
    keeps = {}
    configure = sim.strategy.configure

    def spy(rnd, ids):
        out = configure(rnd, ids)
        keeps[rnd] = {cid: (ins.config.get("keep"), int(ins.mask.sum())) for cid, ins in out.items()}
        return out

    sim.strategy.configure = spy
    summary = sim.run()
    strategy = sim.strategy
    assert strategy.estimate_rounds == 3 and strategy.first_allocation == 4
    for rnd in (1, 2, 3):  # CELM's warm-up: full models, every client keeps its head
        assert keeps[rnd] == {cid: ("head", 48) for cid in range(5)}
    for rnd in (4, 5, 6):
        assert {k for k, _ in keeps[rnd].values()} == {None}
    # The reputation: the coverage of each estimation round's raw evidence, an EMA (β = 0.5) from the
    # first, relative to the top client; recomputed here from the recorded evidence.
    record = json.loads((run / "records.json").read_text())["submodel"]
    assert [e["round"] for e in record["evidence"]] == [1, 2, 3]
    ema = None
    for e in record["evidence"]:
        cov = np.array(_coverage_by_hand(e["raw"]))
        ema = cov if ema is None else 0.5 * ema + 0.5 * cov
    rho = ema / ema.max()
    np.testing.assert_allclose(record["reputation"], rho, rtol=1e-12)
    np.testing.assert_allclose(summary["contributions"], rho, rtol=1e-12)
    lines = _lines(run)
    for line in lines[:3]:
        assert line["mask_sizes"] == [48] * 5
    # Allocation from round 4: the top-reputation client gets the full model, and the thresholds are
    # r_i = ρ_i + (1 − ratio)·100·exp(β(ρ_i − 1))/100 (the full model's relative score is 1; β = 80).
    four = lines[3]
    top = int(np.argmax(rho))
    assert four["mask_sizes"][top] == 48 and min(four["mask_sizes"]) < 48
    ratio = dynamic_ratio(4, 0.2)
    expected = [p + (1 - ratio) * math.exp(80.0 * (p - rho.max())) for p in rho]
    np.testing.assert_allclose(four["thresholds"], expected, rtol=1e-12)
    assert "validation_accuracy" not in four  # nothing was scored on data
    # The audit reads the run: the reputation as shares, and the estimate's evidence.
    from fedhet.report.audit import load_audit

    audit = load_audit(run)
    np.testing.assert_allclose(audit.weights, rho / rho.sum(), rtol=1e-12)
    assert [e["round"] for e in audit.evidence_rounds] == [1, 2, 3]


def test_an_interrupted_data_free_run_resumes_with_identical_results(tmp_path):
    cfg = small_config(rounds=6)
    make_simulation(cfg, run_dir=tmp_path / "full", reference_contributions=STANDALONE).run()

    class Stop(Exception):
        pass

    for cut in (2, 5):  # inside the estimation, and after it

        def stop(rnd, total, line, cut=cut):
            if rnd == cut:
                raise Stop

        run = tmp_path / f"cut{cut}"
        with pytest.raises(Stop):
            make_simulation(cfg, run_dir=run, progress=stop, reference_contributions=STANDALONE).run()
        shutil.rmtree(run / "checkpoints" / f"round_{cut:05d}")
        make_simulation(cfg, run_dir=run, resume=True, reference_contributions=STANDALONE).run()
        assert (run / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


def test_standalone_contributions_with_probe_scores_use_shares_of_the_best_standalone(tmp_path):
    """contributions = "standalone", candidate_score = "probe": c_i / max c in place of c_i (the relative
    score of the full model is 1), sharpened from the accuracies as in the paper."""
    run = tmp_path / "run"
    cfg = small_config("fedrac", rounds=2, candidate_score="probe")
    del cfg.method.params["contribution_warmup"]
    make_simulation(cfg, run_dir=run, reference_contributions=STANDALONE).run()
    two = _lines(run)[1]
    ratio = dynamic_ratio(2, 0.2)
    expected = [c / 0.70 + (1 - ratio) * math.exp(80.0 * (c - 0.70)) for c in STANDALONE]
    np.testing.assert_allclose(two["thresholds"], expected, rtol=1e-12)
    assert two["mask_sizes"][3] == 48


def test_celm_reputations_with_validation_scores_use_shares_of_the_global_accuracy(tmp_path):
    """contributions = "celm", candidate_score = "validation":
    r_i = ρ_i·Acc_g + (Acc_g − ratio·Acc_g)·c^n_i/100."""
    run = tmp_path / "run"
    cfg = small_config("fedrac", rounds=5, contributions="celm", candidate_score="validation")
    summary = make_simulation(cfg, run_dir=run, reference_contributions=STANDALONE).run()
    four = _lines(run)[3]  # the first allocation after the 3 estimation rounds
    rho = np.asarray(summary["contributions"])
    acc_g, ratio = four["validation_accuracy"], dynamic_ratio(4, 0.2)
    assert 0.0 < acc_g < 0.99  # not 1, so a wrong power of it shows
    expected = [p * acc_g + (acc_g - ratio * acc_g) * math.exp(80.0 * (p - rho.max())) for p in rho]
    np.testing.assert_allclose(four["thresholds"], expected, rtol=1e-12)


def test_grown_inputs_start_from_unit_normal_noise_by_default():
    """The default start is N(0, 1) (the strategy passes no scale): with a negligible step the inputs are the
    generator's standard normal draws."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    x, _ = grow_class_inputs(model, (1, 2, 2), 2, per_class=3, depths=[1], lr=1e-12,
                             generator=torch.Generator().manual_seed(7))  # fmt: skip
    expected = torch.randn((6, 1, 2, 2), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(x, expected, rtol=0, atol=1e-9)
