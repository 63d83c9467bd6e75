"""The message boundary: servers know only FederationInfo and messages, clients only their instruction,
state and data; trainers keep nothing between calls; client facts arrive as self-reported descriptions."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from fedhet.algorithms import build_strategy, method_names, strategy_class
from fedhet.algorithms.fedavg import SGDTrainer
from fedhet.config import ExperimentConfig
from fedhet.engine.boundary import check_transport
from fedhet.engine.protocol import ClientData, FederationInfo, Reply, Strategy
from fedhet.engine.simulation import Simulation
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from fedhet.models import build_model

#: What a real server knows (DESIGN.md): nothing per client.
SERVER_KNOWS = {
    "model",
    "num_clients",
    "num_classes",
    "input_shape",
    "rounds",
    "seed",
    "rng",
    "device",
    "eval_batch_size",
    "validation",
    "reference_contributions",
    "aggregation",  # the server's own setting: how it combines models
}
SUBMODEL = tuple(n for n in method_names() if n.startswith(("fedrac", "fedsac")))  # need maskable units
PROXY_HEADS = ("proxyfl",)


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_federation_info_holds_only_what_a_real_server_knows():
    assert {f.name for f in dataclasses.fields(FederationInfo)} == SERVER_KNOWS
    info = _info(build_model("mlp", (1, 4, 4), 3))
    with pytest.raises((AttributeError, TypeError)):
        info.client_sizes = [1, 2, 3]  # frozen, slotted: nothing can be smuggled in


def _info(model: nn.Module, n: int = 3, k: int = 3) -> FederationInfo:
    return FederationInfo(
        model=model,
        num_clients=n,
        num_classes=k,
        input_shape=(1, 4, 4),
        rounds=4,
        seed=0,
        rng=np.random.default_rng(0),
        device=torch.device("cpu"),
        validation=(torch.randn(12, 1, 4, 4), torch.randint(0, k, (12,))),
        reference_contributions=np.array([0.3, 0.5, 0.4]),
    )


def _model_for(name: str) -> nn.Module:
    if name in SUBMODEL:
        return build_model("mlp200", (1, 4, 4), 3, hidden_size=8)
    if name in PROXY_HEADS:
        return build_model("resnet8", (1, 4, 4), 3, width=2)
    return build_model("mlp", (1, 4, 4), 3, hidden_sizes=[6])


@pytest.mark.parametrize("name", method_names())
def test_every_method_sets_up_from_federation_info_and_descriptions_alone(name):
    cls = strategy_class(name)
    assert list(inspect.signature(cls.setup).parameters) == ["self", "info"]
    params = {"candidate_step": 2} if name == "fedsac" else {}
    if name in SUBMODEL and name != "fedsac":
        params = {"candidate_step": 2, "candidate_step_late": 2}
    strategy = build_strategy(name, params)
    strategy.setup(_info(_model_for(name)))
    descriptions = {
        cid: Reply(weights={}, num_examples=10 * (cid + 1), payload={"class_counts": torch.tensor([5, 5, 0])})
        for cid in range(3)
    }
    strategy.receive_descriptions(descriptions)
    instructions = strategy.configure(1, [0, 1, 2])
    assert sorted(instructions) == [0, 1, 2]
    assert isinstance(strategy.trainer_class(), SGDTrainer)  # a client builds its trainer from the name


def test_celm_uses_no_client_descriptions():
    assert strategy_class("celm").receive_descriptions is Strategy.receive_descriptions


def test_own_model_methods_take_the_self_reported_counts():
    for name in ("cffl", "cgsv", "shapfed", "iafl"):
        strategy = build_strategy(name, {"class_imbalance": True} if name == "cffl" else {})
        strategy.setup(_info(_model_for(name)))
        counts = [torch.tensor([4, 0, 0]), torch.tensor([1, 1, 1]), torch.tensor([0, 2, 7])]
        strategy.receive_descriptions(
            {
                cid: Reply(weights={}, num_examples=n, payload={"class_counts": counts[cid]})
                for cid, n in enumerate((4, 3, 9))
            }
        )
        np.testing.assert_array_equal(strategy.sizes, [4, 3, 9])
        np.testing.assert_array_equal(strategy.class_counts, np.stack([c.numpy() for c in counts]))
    np.testing.assert_allclose(strategy.p, [4, 3, 9])  # IAFL's data-size contributions


def _reachable(root):
    """Every object reachable from ``root`` through attributes, slots and containers."""
    seen, stack = set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, torch.Tensor | np.ndarray | np.random.Generator | str | bytes):
            continue
        else:
            if dataclasses.is_dataclass(obj):
                stack.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
            if hasattr(obj, "__dict__"):
                stack.extend(vars(obj).values())


def tiny_config(method: str) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "dirichlet-per-client", 3
    cfg.data.split_params = {"alpha": 0.5}
    cfg.data.max_train_samples, cfg.data.max_test_samples = 900, 200
    cfg.data.validation_fraction = 0.1
    cfg.train.rounds, cfg.train.local_steps, cfg.train.batch_size = 2, 2, 16
    cfg.method.name = method
    if method in SUBMODEL:
        cfg.model.name, cfg.model.params = "mlp200", {"hidden_size": 12}
        cfg.method.params = (
            {"candidate_step": 4} if method == "fedsac" else {"candidate_step": 4, "candidate_step_late": 4}
        )
    elif method in PROXY_HEADS or method.startswith(("fixmatch", "sage", "fedproto", "fedavg-")):
        cfg.data.split, cfg.data.split_params = "labeled-unlabeled", {"labeled_per_class": 10, "alpha": 0.5}
        cfg.model.name, cfg.model.params = "resnet8", {"width": 2}
    if method in ("celm", "celm-rs"):
        cfg.method.params = {"probe_steps": 3, "warmup_fraction": 0.5}
    return cfg


@pytest.mark.parametrize("method", ["fedavg", "standalone", "celm", "cffl", "iafl", "fedrac", "proxyfl"])
def test_after_a_run_no_strategy_holds_client_data_and_no_trainer_kept_state(method):
    cfg = tiny_config(method)
    sim = make_simulation(cfg)
    trainer = sim.trainer
    before = dict(vars(trainer))
    sim.run()
    assert vars(trainer).keys() == before.keys() and all(vars(trainer)[k] is v for k, v in before.items())
    train_storage = sim.fed.clients[0].inputs.untyped_storage().data_ptr()
    for obj in _reachable(sim.strategy):
        assert not isinstance(obj, ClientData), f"{method}'s server holds a client's data"
        if isinstance(obj, torch.Tensor) and obj.numel():
            assert obj.untyped_storage().data_ptr() != train_storage, (
                f"{method}'s server holds training inputs"
            )


def _assignments_to_self(func) -> list[str]:
    """Attributes ``func`` assigns on ``self`` (``self.x = ...``, ``self.x += ...``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                out.append(t.attr)
    return out


@pytest.mark.parametrize("method", method_names())
def test_registered_trainers_assign_nothing_on_self_outside_their_constructor(method):
    """Every trainer hook gets the LocalUpdate, so none needs to stash values on ``self`` between calls:
    one trainer object can serve any client, in any order, on any transport."""
    for klass in strategy_class(method).trainer_class.__mro__:
        if not klass.__module__.startswith("fedhet."):
            continue
        for name, func in vars(klass).items():
            if inspect.isfunction(func) and name != "__init__":
                assert not _assignments_to_self(func), (
                    f"{klass.__name__}.{name} sets {_assignments_to_self(func)}"
                )


def test_simulation_only_features_are_refused_on_other_transports():
    quirk = build_strategy("proxyfl", {"shared_optimizer": True})
    check_transport(quirk, "simulation")
    with pytest.raises(ConfigError, match="shared_optimizer"):
        check_transport(quirk, "flower")
    check_transport(build_strategy("proxyfl", {}), "flower")


def test_declared_inputs_missing_or_broken_are_config_errors_naming_the_fix():
    cfg = tiny_config("fedrac")
    cfg.data.validation_fraction = 0.0
    with pytest.raises(ConfigError, match="validation_fraction"):
        Simulation(
            cfg, build_strategy("fedrac", {"candidate_step": 4}), reference_contributions=[0.1, 0.2, 0.3]
        ).setup()
    cfg = tiny_config("fedrac")
    with pytest.raises(ConfigError, match="reference contributions"):
        Simulation(cfg, build_strategy("fedrac", {"candidate_step": 4})).setup()
    with pytest.raises(ConfigError, match="one finite value per client"):
        Simulation(
            cfg, build_strategy("fedrac", {"candidate_step": 4}), reference_contributions=[0.1, np.nan, 0.3]
        ).setup()
    with pytest.raises(ConfigError, match="eval.fairness=true"):
        cfg = tiny_config("fedavg")
        cfg.eval.fairness = True
        Simulation(cfg, build_strategy("fedavg")).setup()


class LyingTrainer(SGDTrainer):
    """Client 0 claims 100x its samples; client 2 describes broken class counts."""

    def describe(self, data):
        reply = super().describe(data)
        if data.cid == 0:
            reply.num_examples *= 100
        if data.cid == 2:
            reply.payload["class_counts"] = torch.full((data.num_classes,), -1)
        return reply


def test_descriptions_are_self_reported_and_validated(tmp_path, caplog):
    cfg = tiny_config("cgsv")
    cfg.eval.fairness = False
    sim = make_simulation(cfg, run_dir=tmp_path / "run", trainer=LyingTrainer())
    with caplog.at_level("WARNING", logger="fedhet"):
        sim.run()
    true_sizes = sim.fed.sizes
    # the server believes client 0's claim, and leaves out client 2's broken description (size 0)
    np.testing.assert_array_equal(sim.strategy.sizes, [100 * true_sizes[0], true_sizes[1], 0])
    assert "rejected the description of client 2" in caplog.text
    # the run went on: every round aggregated all three clients
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(line["clients"] == [0, 1, 2] for line in lines)
