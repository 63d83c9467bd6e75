"""The GPU path (train.device = "cuda"): data and models stay on the device, local steps make no host syncs,
and results match the CPU run. Skipped without CUDA (CI has none); benchmarks/gpu_check.sh runs it on a
lent accelerator.

Host syncs are counted with ``torch.cuda.set_sync_debug_mode("warn")``, which warns at every operation
that makes the host wait for the device (``.item()``, ``float(t)``, a blocking copy to the host, boolean
indexing). A round's syncs must not grow with its number of local steps: per-client work (the reply's
weights, the guards) may sync, a step may not.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from fedhet.algorithms.logit_probes import maximize_class_logits
from fedhet.config import ExperimentConfig
from fedhet.experiment import make_simulation

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (train.device = 'cuda')")


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def config(method: str, device: str, local_steps: int, **params) -> ExperimentConfig:
    cfg = ExperimentConfig()
    # digits: 1,347 training images, so 2 IID clients of ~673 hold 21 batches of 32 per epoch
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", "iid", 2
    cfg.model.name = "mlp"
    cfg.train.rounds, cfg.train.lr, cfg.train.batch_size, cfg.train.local_steps = 3, 0.1, 32, local_steps
    cfg.train.momentum, cfg.train.device = 0.9, device
    cfg.eval.fairness = False
    cfg.method.name, cfg.method.params = method, dict(params)
    return cfg


SYNC_WARNING = "called a synchronizing CUDA operation"


def round_two_syncs(sim) -> int:
    """Host syncs of round 2 (round 1 pays the one-off CUDA/cuBLAS initialisation)."""
    sim.train_round(1)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            sim.train_round(2)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(SYNC_WARNING in str(w.message) for w in caught)


def syncs_in_round(method: str, local_steps: int, **params) -> int:
    """Host syncs of round 2 of a supervised run with ``local_steps`` steps."""
    sim = make_simulation(config(method, "cuda", local_steps, **params))
    sim.setup()
    # Both step counts stay inside one epoch: each epoch copies its CPU-drawn permutation to the device once.
    assert all(local_steps < len(c.labels) // 32 for c in sim.fed.clients)
    return round_two_syncs(sim)


@pytest.mark.parametrize(
    "method,params",
    [("fedavg", {}), ("fedprox", {"mu": 0.1}), ("fedrs", {"fedrs_alpha": 0.5})],
)
def test_local_steps_make_no_host_sync(method, params):
    few, many = syncs_in_round(method, 2, **params), syncs_in_round(method, 8, **params)
    assert many == few, f"{method}: {few} host syncs with 2 local steps, {many} with 8 (a step syncs)"


def fssl_syncs_in_round(method: str, local_steps: int) -> int:
    """Host syncs of round 2 of a semi-supervised run on digits (augmentations, frozen global model, ICPL)."""
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", "labeled-unlabeled", 2
    cfg.data.split_params = {"labeled_per_class": 10, "alpha": 0.5}
    cfg.model.name, cfg.model.params = "resnet8", {"width": 4}
    cfg.train.rounds, cfg.train.local_steps, cfg.train.batch_size, cfg.train.device = (
        3,
        local_steps,
        8,
        "cuda",
    )
    cfg.eval.fairness, cfg.eval.rewards = False, False
    cfg.method.name = method
    cfg.method.params = {"threshold": 0.5, **({"gpt_epochs": 2} if method == "proxyfl" else {})}
    sim = make_simulation(cfg)
    sim.setup()
    return round_two_syncs(sim)


@pytest.mark.parametrize("method", ["fixmatch-gpl", "proxyfl", "fedproto-fssl"])
def test_semi_supervised_steps_make_no_host_sync(method):
    """Augmentation parameters and batch permutations are drawn on the CPU generators and copied to the
    device through pinned memory without a sync (fedhet.engine.transfer), so a step does not sync."""
    few, many = fssl_syncs_in_round(method, 2), fssl_syncs_in_round(method, 6)
    assert many == few, f"{method}: {few} host syncs with 2 local steps, {many} with 6 (a step syncs)"


def test_sync_counter_sees_a_per_step_sync(monkeypatch):
    """The counter can fail: a trainer that calls .item() every step adds one sync per client and step."""
    from fedhet.algorithms.fedavg import SGDTrainer

    original = SGDTrainer.loss

    def loss_with_item(self, u, batch):
        out = original(self, u, batch)
        out.item()
        return out

    monkeypatch.setattr(SGDTrainer, "loss", loss_with_item)
    few, many = syncs_in_round("fedavg", 2), syncs_in_round("fedavg", 8)
    assert many == few + 2 * 6  # 2 clients x 6 more steps


def test_data_and_models_stay_on_the_device():
    sim = make_simulation(config("fedavg", "auto", 4))
    sim.run()
    assert sim.fed.test_x.is_cuda and sim.fed.test_y.is_cuda
    assert all(c.inputs.is_cuda and c.labels.is_cuda for c in sim.fed.clients)
    assert all(p.is_cuda for p in sim.strategy.global_model().parameters())


def test_cuda_run_matches_the_cpu_run():
    runs = {}
    for device in ("cpu", "cuda"):
        sim = make_simulation(config("fedavg", device, 4))
        sim.run()
        runs[device] = (sim.strategy.global_model().state_dict(), sim.history[-1]["accuracy"])
    (cpu_w, cpu_acc), (gpu_w, gpu_acc) = runs["cpu"], runs["cuda"]
    for k, v in cpu_w.items():
        assert torch.allclose(v, gpu_w[k].cpu(), atol=1e-4), k
    assert abs(cpu_acc - gpu_acc) <= 0.01


def assert_probe_agrees_on_cpu_and_cuda(model, impl: str) -> None:
    """Three perturbed copies of ``model`` probed on the CPU and on CUDA with one seed: the same logits."""
    states = [{k: v + 0.01 * i for k, v in model.state_dict().items()} for i in range(3)]
    out = {}
    for device in ("cpu", "cuda"):
        on = [{k: v.to(device) for k, v in s.items()} for s in states]
        gen = torch.Generator().manual_seed(1)
        out[device] = maximize_class_logits(
            model.to(device), on, (1, 8, 8), 10, steps=20, generator=gen, impl=impl
        )
    assert out["cuda"].is_cuda
    assert torch.allclose(out["cpu"], out["cuda"].cpu(), rtol=1e-3, atol=1e-3)


def test_celm_probe_on_the_device_matches_the_cpu():
    """The generic path (vmap over stacked models) on any module."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )
    assert_probe_agrees_on_cpu_and_cuda(model, "vmap")


def test_celm_closed_form_mlp_probe_on_the_device_matches_the_cpu():
    """CELM's default probe path for the mlp (closed-form input gradients, impl="batched") on the device."""
    from fedhet.models import build_model

    torch.manual_seed(0)
    assert_probe_agrees_on_cpu_and_cuda(build_model("mlp", (1, 8, 8), 10), "batched")


@pytest.mark.parametrize("gradients", ["auto", "vmap"])
def test_vectorized_clients_on_the_device_match_the_sequential_cpu_run(gradients, monkeypatch):
    """engine.mode = "vectorized" on CUDA, by its closed-form (fused plain SGD) and vmap paths: the CPU
    sequential run's weights, and no host sync that grows with the local steps."""
    from fedhet.engine import vectorized

    monkeypatch.setattr(vectorized, "GRADIENTS", gradients)
    runs = {}
    for device, mode in (("cpu", "sequential"), ("cuda", "vectorized")):
        cfg = config("fedavg", device, 4)
        cfg.data.clients, cfg.train.momentum, cfg.engine.mode = 10, 0.0, mode
        sim = make_simulation(cfg)
        sim.run()
        assert sim.transport.vector_refusal == "" or mode == "sequential"
        runs[device] = sim.strategy.global_model().state_dict()
    for k, v in runs["cpu"].items():
        assert torch.allclose(v, runs["cuda"][k].cpu(), atol=1e-4), k
    syncs = {}
    for steps in (2, 6):
        cfg = config("fedavg", "cuda", steps)
        cfg.data.clients, cfg.train.momentum, cfg.engine.mode = 10, 0.0, "vectorized"
        sim = make_simulation(cfg)
        sim.setup()
        syncs[steps] = round_two_syncs(sim)
    assert syncs[6] == syncs[2], syncs
