"""Helpers shared by the tests: one local update through the client entry, as the engine runs it; a tiny
digits config and a run's metrics lines (the fault and attack tests)."""

from __future__ import annotations

import json

import torch

from fedhet.config import ExperimentConfig, apply_override
from fedhet.config_sections import GENERAL_LR
from fedhet.engine.client import run_client
from fedhet.engine.protocol import LR_KEY, ClientState, Instruction, LocalUpdate, Reply, TrainContext


def local_update(
    trainer,
    model,
    data,
    ins: Instruction,
    train,
    *,
    state: ClientState | None = None,
    generator: torch.Generator | None = None,
    rnd: int = 1,
    shared: dict | None = None,
) -> tuple[Reply, ClientState]:
    """``run_client`` with a TrainContext built from ``train`` (the config's TrainConfig); the round's
    learning rate defaults to ``train.lr`` as the round loop would set it."""
    ins.config.setdefault(LR_KEY, train.lr if train.lr is not None else GENERAL_LR)  # unset: not a table
    ctx = TrainContext(
        round=rnd,
        generator=generator if generator is not None else torch.Generator().manual_seed(0),
        device=next(model.parameters()).device,
        train=train,
        model=model,
        shared={} if shared is None else shared,
    )
    return run_client(trainer, ins, state if state is not None else ClientState(), data, ctx)


def prepared_update(trainer, model, data, ins: Instruction, train, *, generator=None) -> LocalUpdate:
    """A LocalUpdate for one step-level test: the model holds the instruction's weights (or its own) and
    the trainer's ``prepare`` has run, so ``trainer.loss(u, batch)`` can be called directly."""
    ins.config.setdefault(LR_KEY, train.lr if train.lr is not None else GENERAL_LR)  # unset: not a table
    ctx = TrainContext(
        round=1,
        generator=generator if generator is not None else torch.Generator().manual_seed(0),
        device=next(model.parameters()).device,
        train=train,
        model=model,
        shared={},
    )
    start = ins.weights if ins.weights else {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(start)
    u = LocalUpdate(model=model, data=data, instruction=ins, state=ClientState(), context=ctx, start=start)
    trainer.prepare(u)
    return u


def aggregate_round(strategy, rnd: int, replies) -> None:
    """The server side of a round as the engine runs it: the three aggregation hooks in order."""
    strategy.before_aggregate(rnd, replies)
    strategy.aggregate(rnd, replies)
    strategy.after_aggregate(rnd, replies)


def digits_config(clients: int = 5, rounds: int = 3, **sets) -> ExperimentConfig:
    """A few rounds of 3 local steps on scikit-learn's digits, IID, one thread; ``sets`` as dotted keys with
    ``__`` for the dots (``faults__clients={"1": "alie"}``)."""
    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "digits", "iid", clients
    cfg.train.rounds, cfg.train.local_steps, cfg.train.threads = rounds, 3, 1
    cfg.eval.fairness = False
    for key, value in sets.items():
        apply_override(cfg, key.replace("__", "."), value)
    return cfg


def lines_of(run_dir) -> list[dict]:
    """The per-round lines of a run's metrics.jsonl."""
    return [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]


def aggregating_strategy(settings: dict, n: int, method: str = "fedavg"):
    """``method``'s strategy set up for ``n`` clients of a tiny MLP with the ``[aggregation]`` ``settings``,
    ready to aggregate hand-made replies."""
    import numpy as np

    from fedhet.algorithms import build_strategy
    from fedhet.engine.protocol import FederationInfo
    from fedhet.models import build_model

    strategy = build_strategy(method)
    torch.manual_seed(0)
    info = FederationInfo(
        model=build_model("mlp", (1, 4, 4), 3, hidden_sizes=[6]),
        num_clients=n, num_classes=3, input_shape=(1, 4, 4), rounds=3, seed=0,
        rng=np.random.default_rng(0), device=torch.device("cpu"), aggregation=settings,
    )  # fmt: skip
    strategy.setup(info)
    return strategy
