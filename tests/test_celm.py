"""CELM (methods.md §1.1): contribution math known answers, probes (batched == loop, real-data sanity),
warm-up head retention, freezing, aggregation with c, missing clients, state round trip, end-to-end runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.algorithms import build_strategy
from fedhet.algorithms.celm import (
    CELM,
    CELMRS,
    baseline_from_global,
    class_shares,
    client_scores,
    debias,
    ema_contributions,
    estimate_contributions,
    probe_generator,
    to_simplex,
    warmup_rounds,
)
from fedhet.algorithms.fedavg import SGDTrainer
from fedhet.algorithms.fedrs import FedRSTrainer
from fedhet.algorithms.logit_probes import maximize_class_logits
from fedhet.config import ExperimentConfig, load_config
from fedhet.engine import checkpoint as ckpt
from fedhet.engine.weights import clone_weights
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from fedhet.models import build_model
from fedhet.models.registry import FedModel

ROOT = Path(__file__).resolve().parents[1]
FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
needs_fashion = pytest.mark.skipif(not FASHION.exists(), reason="Fashion-MNIST idx files missing")


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


# --------------------------------------------------------------------------------------------------------
# Contribution math (hand-made evidence matrices)
# --------------------------------------------------------------------------------------------------------
def test_warmup_rounds_is_the_ceiling_of_the_fraction():
    assert warmup_rounds(0.05, 100) == 5
    assert warmup_rounds(0.05, 200) == 10
    assert warmup_rounds(0.05, 10) == 1
    assert warmup_rounds(0.3, 10) == 3
    assert warmup_rounds(0.25, 10) == 3
    assert warmup_rounds(1.0, 7) == 7


def test_scalar_baseline_debias_shares_simplex_and_ema_known_answer():
    raw = np.array([[5.0, 1.0, 3.0], [2.0, 4.0, 3.0], [1.0, 1.0, 1.0]])
    global_logits = np.array([1.0, 3.0, 2.0])
    assert baseline_from_global(global_logits) == 2.0
    q = debias(raw, 2.0)
    np.testing.assert_array_equal(q, [[3, 0, 1], [0, 2, 1], [0, 0, 0]])
    r = class_shares(q, epsilon=0.0)
    np.testing.assert_allclose(r, [[1, 0, 0.5], [0, 1, 0.5], [0, 0, 0]])
    np.testing.assert_allclose(client_scores(r), [0.5, 0.5, 0.0])
    np.testing.assert_allclose(to_simplex(client_scores(r)), [0.5, 0.5, 0.0])
    step = estimate_contributions(np.full(3, 1 / 3), raw, global_logits, [0, 1, 2], momentum=0.5)
    # c = 0.5 · 1/3 + 0.5 · [0.5, 0.5, 0]
    np.testing.assert_allclose(step.contributions, [5 / 12, 5 / 12, 2 / 12], rtol=1e-7)
    assert step.contributions.sum() == pytest.approx(1.0)


def test_defaults_are_the_papers_values():
    """ε = 1e-8 and β = 0.5 when not passed (hand-computed: shares of [[1], [1]] are 1/(2 + 1e-8) each)."""
    np.testing.assert_allclose(
        class_shares(np.array([[1.0], [1.0]])), [[1 / (2 + 1e-8)], [1 / (2 + 1e-8)]], rtol=1e-15
    )
    np.testing.assert_allclose(
        ema_contributions(np.array([0.6, 0.4]), np.array([0.0, 1.0]), [0, 1]), [0.3, 0.7]
    )
    raw, top = np.array([[3.0, 1.0], [1.0, 3.0]]), np.array([1.0, 1.0])
    step = estimate_contributions(np.array([0.8, 0.2]), raw, top, [0, 1])  # c̄ = [0.5, 0.5], β = 0.5
    np.testing.assert_allclose(step.contributions, [0.65, 0.35])
    assert step.baseline == 1.0  # the scalar b = mean of the global logits, kept in the step


def test_estimate_contributions_passes_epsilon_and_checks_the_rows():
    raw, top = np.array([[3.0, 1.0], [1.0, 1.0]]), np.array([1.0, 1.0])
    # q = [[2, 0], [0, 0]]; with ε = 1: r = [[2/3, 0], [0, 0]], ĉ = [1/3, 0] -> c̄ = [1, 0]; shares keep ε
    step = estimate_contributions(np.array([0.5, 0.5]), raw, top, [0, 1], momentum=0.0, epsilon=1.0)
    np.testing.assert_allclose(step.shares, [[2 / 3, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="one row per client"):
        estimate_contributions(np.full(3, 1 / 3), np.ones((3, 2)), top, [0, 1])  # 3 rows for 2 clients
    with pytest.raises(ValueError, match="one row per client"):
        estimate_contributions(np.full(2, 0.5), np.ones(2), top, [0, 1])  # not a matrix


def test_ema_with_no_client_present_keeps_every_weight():
    prev = np.array([0.2, 0.3, 0.5])
    np.testing.assert_array_equal(ema_contributions(prev, np.array([]), []), prev)


def test_ema_computes_in_float64_from_a_float32_current_estimate():
    cur = np.array([0.1, 0.9], dtype=np.float32)
    c0, c1 = float(cur[0]), float(cur[1])  # the float32 values, in float64 arithmetic (mass = 1)
    got = ema_contributions(np.array([0.5, 0.5]), cur, [0, 1], 0.3)
    np.testing.assert_allclose(got, [0.3 * 0.5 + 0.7 * c0, 0.3 * 0.5 + 0.7 * c1], rtol=1e-15)


def test_the_probe_uses_the_configured_implementation(monkeypatch):
    """probe_impl reaches the probe (the implementations agree in value, so only a spy can tell)."""
    import fedhet.algorithms.celm as celm_module

    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return torch.zeros(len(args[1]), args[3])

    monkeypatch.setattr(celm_module, "maximize_class_logits", spy)
    strategy = CELM(probe_impl="loop", probe_steps=7, probe_lr=0.3, probe_l2=0.02, probe_init_scale=0.4)
    model = torch.nn.Linear(4, 3)
    strategy.estimator.setup(
        type(
            "Info", (), {"model": model, "num_clients": 2, "num_classes": 3, "seed": 0, "input_shape": (4,)}
        )()
    )
    strategy.probe([model.state_dict()], 1)
    assert (seen["impl"], seen["steps"], seen["lr"], seen["l2"], seen["init_scale"]) == (
        "loop",
        7,
        0.3,
        0.02,
        0.4,
    )


def test_the_formulas_compute_in_float64_from_float32_inputs():
    """The probes' logits arrive as float32 tensors; every step returns float64 (the EMA runs for many
    rounds, and ties between clients are decided on these values)."""
    f32 = np.array([[0.3, 0.1], [0.1, 0.2]], dtype=np.float32)
    assert class_shares(f32).dtype == np.float64
    assert client_scores(f32).dtype == np.float64
    assert to_simplex(np.array([0.3, 0.1], dtype=np.float32)).dtype == np.float64
    assert baseline_from_global(np.array([0.3, 0.1], dtype=np.float32), per_class=True).dtype == np.float64
    prev = np.array([0.6, 0.4], dtype=np.float32)
    ema = ema_contributions(prev, np.array([0.5, 0.5]), [0, 1], 0.1)
    assert ema.dtype == np.float64
    # the float32 values, exactly, in float64 arithmetic; c̄ is scaled to the present clients' mass p0 + p1
    p0, p1 = float(prev[0]), float(prev[1])
    mass = p0 + p1
    np.testing.assert_allclose(ema, [0.1 * p0 + 0.9 * 0.5 * mass, 0.1 * p1 + 0.9 * 0.5 * mass], rtol=1e-15)


def test_per_class_baseline_subtracts_each_classes_global_logit():
    raw = np.array([[5.0, 1.0, 3.0], [2.0, 4.0, 3.0], [1.0, 1.0, 1.0]])
    global_logits = np.array([1.0, 3.0, 2.0])
    step = estimate_contributions(
        np.full(3, 1 / 3), raw, global_logits, [0, 1, 2], momentum=0.0, epsilon=0.0, per_class_baseline=True
    )
    np.testing.assert_array_equal(step.debiased, [[4, 0, 1], [1, 1, 1], [0, 0, 0]])
    np.testing.assert_allclose(step.shares, [[0.8, 0, 0.5], [0.2, 1, 0.5], [0, 0, 0]])
    # ĉ = [1.3, 1.7, 0] / 3 -> simplex [0.4333, 0.5667, 0]; momentum 0 -> c = c̄
    np.testing.assert_allclose(step.contributions, [1.3 / 3, 1.7 / 3, 0.0])
    # the scalar baseline (b = 2) gives a different answer on the same matrix
    scalar = estimate_contributions(np.full(3, 1 / 3), raw, global_logits, [0, 1, 2], momentum=0.0)
    np.testing.assert_allclose(scalar.contributions, [0.5, 0.5, 0.0], atol=1e-8)


def test_epsilon_enters_the_class_shares():
    r = class_shares(np.array([[1e-8], [0.0]]), epsilon=1e-8)
    np.testing.assert_allclose(r, [[0.5], [0.0]])


def test_all_evidence_below_the_baseline_gives_uniform_weights():
    raw = np.array([[1.0, 2.0], [0.5, 1.5]])
    step = estimate_contributions(np.array([0.7, 0.3]), raw, np.array([3.0, 3.0]), [0, 1], momentum=0.5)
    np.testing.assert_array_equal(step.debiased, 0.0)
    np.testing.assert_allclose(step.scores, [0.5, 0.5])
    np.testing.assert_allclose(step.contributions, [0.6, 0.4])  # 0.5·[0.7, 0.3] + 0.5·[0.5, 0.5]


def test_one_client_gets_all_the_weight():
    step = estimate_contributions(np.array([1.0]), np.array([[5.0, 0.5]]), np.array([1.0, 1.0]), [0])
    np.testing.assert_allclose(step.scores, [1.0])
    np.testing.assert_allclose(step.contributions, [1.0])


def test_a_class_without_evidence_counts_for_no_client():
    raw = np.array([[3.0, 0.0, 2.0], [1.0, 0.0, 2.0]])
    step = estimate_contributions(np.full(2, 0.5), raw, np.array([1.0, 1.0, 1.0]), [0, 1], momentum=0.0)
    np.testing.assert_allclose(step.shares[:, 1], 0.0)
    # class 0: shares [1, 0]; class 2: [0.5, 0.5]; class 1: none -> ĉ = [1.5, 0.5]/3 -> [0.75, 0.25]
    np.testing.assert_allclose(step.contributions, [0.75, 0.25], rtol=1e-7)


def test_missing_clients_keep_their_weight_and_c_stays_on_the_simplex():
    previous = np.array([0.1, 0.2, 0.3, 0.4])
    out = ema_contributions(previous, np.array([0.25, 0.75]), [1, 3], momentum=0.5)
    # the present clients held 0.6: c_1 = 0.5·0.2 + 0.5·0.25·0.6, c_3 = 0.5·0.4 + 0.5·0.75·0.6
    np.testing.assert_allclose(out, [0.1, 0.175, 0.3, 0.425])
    assert out.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(
        ema_contributions(previous, np.array([0.5, 0.5]), [0, 2], momentum=1.0), previous
    )


# --------------------------------------------------------------------------------------------------------
# Probes
# --------------------------------------------------------------------------------------------------------
@pytest.mark.numerics
@pytest.mark.parametrize(
    ("name", "shape", "steps", "impl"),
    [
        ("mlp", (1, 28, 28), 30, "batched"),  # the MLP's closed-form input gradients
        ("mlp", (1, 28, 28), 30, "vmap"),
        ("cnn", (3, 32, 32), 8, "batched"),  # vmap
    ],
)
def test_batched_probe_equals_the_per_class_loop(name, shape, steps, impl):
    torch.manual_seed(3)
    models = [build_model(name, shape, 10) for _ in range(3)]
    states = [m.state_dict() for m in models]
    kw = dict(steps=steps, lr=0.05, l2=1e-3, init_scale=1.0)
    batched = maximize_class_logits(
        models[0], states, shape, 10, generator=probe_generator(0, 1), impl=impl, **kw
    )
    loop = maximize_class_logits(
        models[0], states, shape, 10, generator=probe_generator(0, 1), impl="loop", **kw
    )
    assert batched.shape == (3, 10)
    torch.testing.assert_close(batched, loop, rtol=1e-4, atol=1e-4)
    # the ascent raised every logit above its value at the start noise; no weight was touched
    with torch.no_grad():
        noise = torch.randn((3, 10, *shape), generator=probe_generator(0, 1))
        start = torch.stack(
            [m.eval()(noise[i])[torch.arange(10), torch.arange(10)] for i, m in enumerate(models)]
        )
    assert bool((batched > start).all())


class LinearModel(FedModel):
    """s(x) = W·flatten(x) + b: its probe has a closed form (the implementations share nothing with it)."""

    def __init__(self, inputs: int, classes: int) -> None:
        super().__init__()
        self.head = torch.nn.Linear(inputs, classes)

    def features(self, x):
        return x.flatten(1)


class LinearStack(LinearModel):
    """The same model declaring itself a ReLU stack with no hidden layer (the closed-form gradient path)."""

    def relu_stack_layers(self):
        return ["head"]


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("model_class", "impl"), [(LinearModel, "vmap"), (LinearModel, "loop"), (LinearStack, "batched")]
)
def test_the_probe_of_a_linear_model_reaches_the_closed_form(model_class, impl):
    """max_x w_c·x + b_c − λ‖x‖² is at x* = w_c/(2λ), where s* = ‖w_c‖²/(2λ) + b_c: a wrong sign or factor
    on λ, a wrong class index or a mutated weight gives another value."""
    torch.manual_seed(0)
    model = model_class(4, 3)
    with torch.no_grad():
        model.head.weight.mul_(4.0)
    l2 = 0.5
    got = maximize_class_logits(
        model,
        [model.state_dict()],
        (1, 2, 2),
        3,
        steps=2000,
        lr=0.05,
        l2=l2,
        generator=torch.Generator().manual_seed(1),
        impl=impl,
    )[0]
    w, b = model.head.weight.detach(), model.head.bias.detach()
    torch.testing.assert_close(got, (w * w).sum(1) / (2 * l2) + b, rtol=1e-4, atol=1e-4)
    assert torch.equal(model.head.weight.detach(), w)  # the probe did not move the weights


@pytest.mark.numerics
def test_probe_is_deterministic_in_seed_and_round():
    model = build_model("mlp", (1, 28, 28), 10)
    states = [model.state_dict()]
    run = lambda seed, rnd: maximize_class_logits(  # noqa: E731
        model, states, (1, 28, 28), 10, steps=5, generator=probe_generator(seed, rnd)
    )
    assert torch.equal(run(0, 1), run(0, 1))
    assert not torch.equal(run(0, 1), run(0, 2))
    assert not torch.equal(run(0, 1), run(1, 1))


@needs_fashion
def test_models_trained_on_disjoint_classes_show_evidence_on_their_own_classes():
    from fedhet.data.datasets import load_dataset

    ds = load_dataset("fashion-mnist", None)
    x, y = ds.normalize(ds.train_x[:4000]), ds.train_y[:4000]
    torch.manual_seed(0)
    init = build_model("mlp", (1, 28, 28), 10)
    owned = (torch.arange(5), torch.arange(5, 10))
    models = []
    for classes in owned:
        model = build_model("mlp", (1, 28, 28), 10)
        model.load_state_dict(init.state_dict())
        keep = torch.isin(y, classes)
        xs, ys = x[keep], y[keep]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in torch.randperm(len(xs), generator=torch.Generator().manual_seed(1)).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xs[batch]), ys[batch]).backward()
            opt.step()
        models.append(model)
    evidence = maximize_class_logits(
        init, [m.state_dict() for m in models], (1, 28, 28), 10, generator=probe_generator(0, 1)
    )
    a, b = evidence
    assert bool((a[:5] > b[:5]).all()), evidence  # model A's classes 0-4
    assert bool((b[5:] > a[5:]).all()), evidence  # model B's classes 5-9
    # and the contribution math turns that into a 50/50 split of the credit
    step = estimate_contributions(
        np.full(2, 0.5), evidence.double().numpy(), np.zeros(10), [0, 1], momentum=0.0
    )
    np.testing.assert_allclose(step.contributions, [0.5, 0.5], atol=0.1)


# --------------------------------------------------------------------------------------------------------
# The strategy in the engine
# --------------------------------------------------------------------------------------------------------
def small_config(method: str = "celm", **params) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "iid", 3
    cfg.data.max_train_samples, cfg.data.max_test_samples = 1500, 500
    cfg.model.name = "mlp"
    cfg.train.rounds = 4
    cfg.train.schedule = "cosine"
    cfg.eval.fairness = False
    cfg.eval.checkpoint_every = 1
    cfg.method.name = method
    # the paper's evidence (no clip) unless a test asks: the clip has its own tests (test_celm_evidence_clip)
    cfg.method.params = {"warmup_fraction": 0.5, "probe_steps": 10, "evidence_clip": 0, **params}
    return cfg


class RecordingTrainer(SGDTrainer):
    """Records what each client was sent, where its training started and what it replied (a test probe;
    the registered trainers keep nothing on ``self``)."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, int], list[str]] = {}
        self.starts: dict[tuple[int, int], dict] = {}
        self.replies: dict[tuple[int, int], dict] = {}

    def fit(self, u):
        key = (u.context.round, u.data.cid)
        self.sent[key] = sorted(u.instruction.weights)
        self.starts[key] = clone_weights(u.start)
        reply = super().fit(u)
        self.replies[key] = clone_weights(reply.weights)
        return reply


def _run_recorded(cfg: ExperimentConfig, run_dir=None):
    trainer = RecordingTrainer()
    sim = make_simulation(cfg, run_dir=run_dir, trainer=trainer)
    sim.setup()  # run() sets up again, to the same seeded initial model
    initial = clone_weights(sim.strategy.model.state_dict())
    globals_after: list[dict] = []
    sim.progress = lambda rnd, total, line: globals_after.append(
        clone_weights(sim.strategy.model.state_dict())
    )
    summary = sim.run()
    return sim, trainer, globals_after, summary, initial


def _average(states: list[dict], weights: np.ndarray) -> dict:
    p = weights / weights.sum()
    return {k: sum(float(w) * s[k] for w, s in zip(p, states, strict=True)) for k in states[0]}


@needs_fashion
def test_warmup_sends_the_backbone_keeps_local_heads_then_sends_the_full_model(tmp_path):
    cfg = small_config()
    sim, rec, globals_after, _, initial = _run_recorded(cfg)
    strategy: CELM = sim.strategy
    assert strategy.warmup == 2
    backbone = sorted(strategy.model.backbone_keys())
    everything = sorted(strategy.model.state_dict())
    head = "head.weight"
    for cid in range(3):
        # round 1: no client holds a head yet, so it gets the full (initial) model; round 2 the backbone only
        assert rec.sent[(1, cid)] == everything and rec.sent[(2, cid)] == backbone
        assert rec.sent[(3, cid)] == everything and rec.sent[(4, cid)] == everything
        # round 1 starts from the shared initial head
        assert torch.equal(rec.starts[(1, cid)][head], initial[head])
        # round 2: the client's own head from round 1, not the global (c-averaged) one
        assert torch.equal(rec.starts[(2, cid)][head], rec.replies[(1, cid)][head])
        assert not torch.allclose(rec.starts[(2, cid)][head], globals_after[0][head])
        assert torch.equal(rec.starts[(2, cid)]["hidden.0.weight"], globals_after[0]["hidden.0.weight"])
        # round 3 (after warm-up): the full global model
        for key in everything:
            assert torch.equal(rec.starts[(3, cid)][key], globals_after[1][key])
    assert not torch.equal(rec.starts[(2, 0)][head], rec.starts[(2, 1)][head])


@needs_fashion
def test_a_client_first_sampled_late_in_warmup_gets_the_global_head_then_keeps_its_own():
    cfg = small_config(warmup_fraction=1.0)
    cfg.data.clients, cfg.train.clients_per_round = 4, 2
    sim, rec, globals_after, _, initial = _run_recorded(cfg)
    strategy: CELM = sim.strategy
    backbone, everything = sorted(strategy.backbone_keys), sorted(strategy.model.state_dict())
    head = "head.weight"
    last_head: dict[int, torch.Tensor] = {}
    newcomers_after_round_1 = 0
    for rnd in range(1, cfg.train.rounds + 1):
        global_before = initial if rnd == 1 else globals_after[rnd - 2]
        for cid in sorted(c for r, c in rec.sent if r == rnd):
            if cid not in last_head:  # never trained: the full model, the current global head
                assert rec.sent[(rnd, cid)] == everything
                assert torch.equal(rec.starts[(rnd, cid)][head], global_before[head])
                newcomers_after_round_1 += rnd > 1
            else:  # trained before: the backbone only, its own head from its last round
                assert rec.sent[(rnd, cid)] == backbone
                assert torch.equal(rec.starts[(rnd, cid)][head], last_head[cid])
            last_head[cid] = rec.replies[(rnd, cid)][head]
    assert newcomers_after_round_1 > 0  # the scenario exercises a late newcomer


@needs_fashion
def test_weights_freeze_after_warmup_and_aggregation_uses_them(tmp_path):
    cfg = small_config()
    sim, rec, globals_after, summary, _ = _run_recorded(cfg, run_dir=tmp_path / "run")
    strategy: CELM = sim.strategy
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    history = {line["round"]: np.array(line["contributions"]) for line in lines}
    assert not np.allclose(history[1], 1 / 3)  # the estimate moved away from c^0
    np.testing.assert_array_equal(history[3], history[2])
    np.testing.assert_array_equal(history[4], history[2])
    np.testing.assert_allclose(summary["contributions"], history[2])
    assert [line["celm_phase"] for line in lines] == ["warmup", "warmup", "frozen", "frozen"]
    assert lines[3]["contributions"] == lines[1]["contributions"]
    for rnd in (1, 4):  # warm-up and frozen rounds: w_g = Σ c_i w_i
        expected = _average([rec.replies[(rnd, c)] for c in range(3)], history[rnd])
        for key, value in expected.items():
            torch.testing.assert_close(globals_after[rnd - 1][key], value, rtol=1e-5, atol=1e-6)
    assert len(strategy.evidence) == 2
    assert strategy.evidence[0]["raw"].shape == (3, 10)


@needs_fashion
def test_the_recorded_evidence_recomputes_the_weights_and_the_baseline_is_the_previous_global_probe(tmp_path):
    """The weights of every warm-up round, recomputed from the run's records with the formulas written out
    again; the baseline row, re-probed from the global model of the round before (the loop reference)."""
    cfg = small_config(warmup_fraction=0.75)  # T_w = 3 of 4 rounds
    sim, _, globals_after, _, initial = _run_recorded(cfg, run_dir=tmp_path / "run")
    lines = {
        ln["round"]: ln
        for ln in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    }
    evidence = json.loads((tmp_path / "run" / "records.json").read_text())["celm"]["evidence"]
    assert [e["round"] for e in evidence] == [1, 2, 3]
    c = np.full(3, 1 / 3)
    for e in evidence:
        raw, top = np.array(e["raw"]), np.array(e["global"])
        q = np.maximum(raw - top.mean(), 0.0)  # b = the mean over classes of the global model's logits
        r = q / (q.sum(axis=0) + 1e-8)
        c_bar = r.mean(axis=1) / r.mean(axis=1).sum()
        c = 0.5 * c + 0.5 * c_bar
        np.testing.assert_allclose(lines[e["round"]]["contributions"], c, rtol=1e-9)
        previous = initial if e["round"] == 1 else globals_after[e["round"] - 2]
        reprobed = maximize_class_logits(
            sim.strategy.model,
            [previous],
            (1, 28, 28),
            10,
            steps=10,
            generator=probe_generator(0, e["round"]),
            impl="loop",
        )[0]
        np.testing.assert_allclose(top, reprobed.double().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lines[4]["contributions"], c)  # frozen after warm-up


@needs_fashion
def test_every_parameter_reaches_the_estimate_recomputed_from_the_records(tmp_path):
    """Non-default settings of every CELM parameter, recomputed independently from the run's records: the
    global row re-probed with the same probe settings (another implementation) and divided by its median
    (evidence_scale), the per-class baseline, ε, β and the 'first' initial value (c^1 = c̄^1)."""
    params = dict(warmup_fraction=0.75, ema_momentum=0.8, epsilon=0.5, per_class_baseline=True,
                  initial_contributions="first", probe_lr=0.2, probe_l2=0.01, probe_init_scale=0.5,
                  probe_impl="vmap", evidence_scale="median")  # fmt: skip
    cfg = small_config(**params)
    sim, _, globals_after, _, initial = _run_recorded(cfg, run_dir=tmp_path / "run")
    lines = {
        ln["round"]: ln
        for ln in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    }
    evidence = json.loads((tmp_path / "run" / "records.json").read_text())["celm"]["evidence"]
    c = None
    for e in evidence:
        raw, top = np.array(e["raw"]), np.array(e["global"])
        previous = initial if e["round"] == 1 else globals_after[e["round"] - 2]
        reprobed = maximize_class_logits(
            sim.strategy.model, [previous], (1, 28, 28), 10, steps=10, lr=0.2, l2=0.01, init_scale=0.5,
            generator=probe_generator(0, e["round"]), impl="loop",
        )[0].double().numpy()  # fmt: skip
        np.testing.assert_allclose(top, reprobed / max(abs(np.median(reprobed)), 1e-8), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(e["baseline"], top)  # b_c = the global model's own (rescaled) logit
        q = np.maximum(raw - top[None, :], 0.0)
        r = q / (q.sum(axis=0) + 0.5)
        c_bar = r.mean(axis=1) / r.mean(axis=1).sum()
        np.testing.assert_allclose(e["scores"], c_bar, rtol=1e-9)
        c = c_bar if c is None else 0.8 * c + 0.2 * c_bar
        np.testing.assert_allclose(lines[e["round"]]["contributions"], c, rtol=1e-9)


@needs_fashion
def test_clients_missing_in_a_warmup_round_keep_their_weight(tmp_path):
    cfg = small_config(warmup_fraction=1.0)
    cfg.data.clients = 4
    cfg.train.client_dropout = 0.5
    sim = make_simulation(cfg, run_dir=tmp_path / "run")
    sim.run()
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(line.get("dropped") for line in lines)
    previous = np.full(4, 0.25)
    evidence = {e["round"]: e for e in sim.strategy.evidence}
    for line in lines:
        c = np.array(line["contributions"])
        assert c.sum() == pytest.approx(1.0)
        for cid in line.get("dropped", []):
            assert c[cid] == pytest.approx(previous[cid], abs=1e-12)
            if line["round"] in evidence:
                assert np.isnan(evidence[line["round"]]["raw"][cid]).all()
        previous = c


@needs_fashion
def test_state_dict_round_trips_through_a_checkpoint(tmp_path):
    cfg = small_config(per_class_baseline=True)
    sim = make_simulation(cfg, run_dir=None)
    sim.run()
    path = ckpt.save_checkpoint(tmp_path / "ck", {"strategy": sim.strategy.state_dict()})
    fresh = build_strategy("celm", cfg.method.params)
    fresh.setup(sim.info)
    fresh.load_state_dict(ckpt.load_checkpoint(path)["strategy"])
    np.testing.assert_array_equal(fresh.contributions(), sim.strategy.contributions())
    assert fresh.with_heads == sim.strategy.with_heads == {0, 1, 2} and fresh.estimates == 2
    for a, b in zip(fresh.evidence, sim.strategy.evidence, strict=True):
        assert a["round"] == b["round"]
        for key in ("raw", "global", "baseline", "debiased", "scores"):
            np.testing.assert_array_equal(a[key], b[key])
    for key, value in sim.strategy.model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[key], value)


class Interrupt(Exception):
    pass


@needs_fashion
@pytest.mark.parametrize("params", [{}, {"evidence_clip": 1.0}], ids=["defaults", "evidence-clip"])
def test_a_run_interrupted_in_warmup_resumes_with_identical_results(tmp_path, params):
    cfg = small_config(**params)  # the clip's kept heads travel in the checkpoint too
    make_simulation(cfg, run_dir=tmp_path / "full").run()

    def stop_at_2(rnd, total, line):
        if rnd == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        make_simulation(cfg, run_dir=tmp_path / "cut", progress=stop_at_2).run()
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "round_00002")  # resume from round 1: re-probe round 2
    make_simulation(cfg, run_dir=tmp_path / "cut", resume=True).run()
    for name in ("metrics.jsonl", "contributions.csv", "evidence/round_002_raw.csv"):
        assert (tmp_path / "cut" / name).read_text() == (tmp_path / "full" / name).read_text(), name


@pytest.mark.slow
@needs_fashion
@pytest.mark.parametrize("method", ["celm", "celm-rs"])
def test_end_to_end_run_writes_contribution_artifacts(tmp_path, method):
    cfg = small_config(method)
    cfg.data.split = "maverick"
    cfg.data.clients = 4
    cfg.data.max_train_samples = 4000
    cfg.eval.every = 2
    run = tmp_path / "run"
    sim = make_simulation(cfg, run_dir=run)
    summary = sim.run()
    assert isinstance(sim.strategy, CELMRS if method == "celm-rs" else CELM)
    assert isinstance(sim.trainer, FedRSTrainer) == (method == "celm-rs")
    assert summary["final"]["accuracy"] > 0.6
    assert "rare_class_recall" in summary["final"]
    assert sum(summary["contributions"]) == pytest.approx(1.0)
    rows = (run / "contributions.csv").read_text().splitlines()
    assert rows[0] == "round,phase,client,contribution,site" and len(rows) == 1 + 4 * 4  # rounds x clients
    fashion = "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
    for t in (1, 2):
        raw = (run / "evidence" / f"round_{t:03d}_raw.csv").read_text().splitlines()
        assert raw[0] == f"model,{fashion},site"  # a column per class, named as the data name them
        assert raw[1].startswith("global_previous,") and len(raw) == 2 + 4
        assert (
            (run / "evidence" / f"round_{t:03d}_debiased.csv")
            .read_text()
            .splitlines()[1]
            .startswith("baseline,")
        )
    for fig in ("celm_contributions", "celm_evidence", "celm_final_weights"):
        assert (run / "figures" / f"{fig}.png").stat().st_size > 1000
    from fedhet.report import write_report

    text = write_report([run], tmp_path / "report.md").read_text()
    assert "celm evidence" in text and "celm final weights" in text


@needs_fashion
def test_global_backbone_option_probes_client_heads_on_the_previous_global_backbone():
    from fedhet.engine.protocol import Reply

    sim = make_simulation(small_config(probe_backbone="global"), run_dir=None)
    sim.setup()
    strategy: CELM = sim.strategy
    torch.manual_seed(5)
    replies = {
        c: Reply(
            weights={k: torch.randn_like(v) for k, v in strategy.model.state_dict().items()}, num_examples=1
        )
        for c in (0, 2)
    }
    states = strategy.probed_states([0, 2], replies)
    global_state = strategy.model.state_dict()
    assert len(states) == 3 and all(torch.equal(states[0][k], v) for k, v in global_state.items())
    for state, cid in zip(states[1:], (0, 2), strict=True):
        for key in strategy.backbone_keys:
            assert torch.equal(state[key], global_state[key])
        for key in strategy.model.head_keys():
            assert torch.equal(state[key], replies[cid].weights[key])
    strategy.probe_backbone = "client"  # the paper's default probes the client's own model
    assert all(
        torch.equal(strategy.probed_states([0], replies)[1][k], v) for k, v in replies[0].weights.items()
    )


def test_invalid_parameters_are_config_errors():
    with pytest.raises(ConfigError, match="warmup_fraction"):
        CELM(warmup_fraction=0.0)
    with pytest.raises(ConfigError, match="probe_impl"):
        CELM(probe_impl="fast")
    with pytest.raises(ConfigError, match="probe_steps"):
        CELM(probe_steps=0)
    with pytest.raises(ConfigError, match="initial_contributions"):
        CELM(initial_contributions="random")
    with pytest.raises(ConfigError, match="probe_backbone"):
        CELM(probe_backbone="local")
    with pytest.raises(ConfigError, match="no parameter"):
        build_strategy("celm", {"weighting": "uniform"})
    strategy = build_strategy("celm-rs", {"fedrs_alpha": 0.1, "per_class_baseline": True})
    assert strategy.fedrs_alpha == 0.1 and strategy.estimator.per_class_baseline


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "celm").glob("*.toml")), ids=lambda p: p.stem)
def test_celm_configs_parse_and_build(path):
    cfg = load_config(path)
    assert cfg.method.name == "celm"
    build_strategy(cfg.method.name, cfg.method.params)
    assert cfg.train.schedule == "cosine" and cfg.train.lr == 0.1 and cfg.train.batch_size == 64


@pytest.mark.numerics
def test_probe_adam_ascent_is_torch_adam_maximizing():
    from fedhet.algorithms.logit_probes import AdamAscent

    gen = torch.Generator().manual_seed(3)
    reference = torch.randn(4, 7, generator=gen).requires_grad_(True)
    ours = reference.detach().clone()
    opt, ascent = torch.optim.Adam([reference], lr=0.05, maximize=True), AdamAscent(ours, 0.05)
    # gradients from 1e-9 to 10 in scale, so that ε (1e-8 beside √v) matters for the smallest entries
    scale = 10.0 ** torch.empty(4, 7).uniform_(-9, 1, generator=gen)
    for _ in range(50):
        grad = torch.randn(4, 7, generator=gen) * scale
        reference.grad = grad.clone()
        opt.step()
        ascent.step(grad)
    # Two implementations of one formula (torch's may take its foreach or fused kernel): ~6 float32 roundings
    # per step on entries of magnitude ≤ 3 over 50 steps bound the difference far below 1e-5, while a wrong
    # β, ε or bias correction moves the first step alone by ≥ 1e-3 of lr = 0.05.
    torch.testing.assert_close(ours, reference.detach(), rtol=1e-5, atol=1e-5)


# -- tests for the mutants a mutation run left alive (tools/mutation.py) --------------------------------
@pytest.mark.numerics
def test_probe_dispatch_defaults_and_start_noise(monkeypatch):
    """Each impl runs its own implementation, observed by spies on the three implementation functions (not by
    bit patterns: loop, vmap and the MLP's closed form are different numerics, and whether they agree bit for
    bit depends on the CPU's kernels); the default budget is 200 steps; without a generator the start noise
    is seed 0's, not the global RNG's."""
    import fedhet.algorithms.logit_probes as probes

    torch.manual_seed(11)
    shape = (1, 28, 28)
    models = [build_model("mlp", shape, 10) for _ in range(2)]
    template, states = models[0], [m.state_dict() for m in models]
    kw = dict(steps=5, lr=0.05, l2=1e-3)
    noise = probes.probe_noise(2, 10, shape, 1.0, torch.Generator().manual_seed(0))
    reference = probes.maximize_logits_loop(template, states, noise, **kw)
    calls: list[str] = []
    for name in ("maximize_logits_loop", "maximize_logits_batched", "maximize_logits_mlp"):
        real = getattr(probes, name)
        spy = lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k)  # noqa: E731
        monkeypatch.setattr(probes, name, spy)
    ran = dict(loop="maximize_logits_loop", vmap="maximize_logits_batched", batched="maximize_logits_mlp")
    for impl, implementation in ran.items():
        calls.clear()
        torch.manual_seed(99)  # the global RNG must not matter
        got = maximize_class_logits(template, states, shape, 10, impl=impl, **kw)
        assert calls == [implementation], impl
        if impl == "loop":  # the reference's own code path on the same noise: the same floats
            assert torch.equal(got, reference)
        else:  # another implementation: the probe tests' tolerance (float32 Adam steps on O(1) logits)
            torch.testing.assert_close(got, reference, rtol=1e-4, atol=1e-4, msg=impl)
    small = dict(lr=0.05, l2=1e-3)
    default = maximize_class_logits(template, states[:1], shape, 10, **small)
    assert torch.equal(default, maximize_class_logits(template, states[:1], shape, 10, steps=200, **small))
    assert not torch.equal(
        default, maximize_class_logits(template, states[:1], shape, 10, steps=201, **small)
    )
