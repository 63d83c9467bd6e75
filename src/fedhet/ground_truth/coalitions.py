"""The utility of every coalition of a federation: each coalition's model trained on its clients alone.

For N clients there are 2^N − 1 non-empty coalitions S. Each is trained as a run with ``train.participants =
S`` would train it: the same split (made over all N clients), seed, rounds, initial model and, per client and
round, the same batches (a client's batches depend on (seed, round, client) only, fedhet.engine.seeds). Its
utility is the test accuracy of its final global model (balanced accuracy and loss beside it); the empty
coalition's is the initial model's.

Two ways, which give the same numbers up to float reassociation (tested):

- :func:`train_together`, for FedAvg: every (coalition, client) pair of a round is one member of a stacked
  SGD program (fedhet.engine.vectorized), N·2^(N−1) members per round, and each coalition's average is one
  ``index_add_`` over its members. Coalitions share no weights, but a round's batches of client i serve every
  coalition holding i.
- :func:`train_one_at_a_time`, for any registered method: one embedded run per coalition.

Utilities are of the data, not of a defence: the server-side guards judge an update against the round's
others, which change with the coalition, so every coalition is trained with them off (``coalition_config``).
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.attacks import attack_class
from fedhet.config import ExperimentConfig, apply_overrides
from fedhet.errors import ConfigError

#: What a coalition's utility is measured as; the first is the utility the values are computed from.
UTILITIES = ("accuracy", "balanced_accuracy", "loss")

#: The guard settings every coalition is trained with (off: see the module docstring).
GUARDS_OFF = {
    "guards.update_norm_factor": 0.0,
    "guards.update_norm_clip": 0.0,
    "guards.num_examples_factor": 0.0,
    "guards.min_update_cosine": None,
}


#: The most clients fedhet trains every coalition of (2^12 − 1 = 4,095 coalitions).
MAX_CLIENTS = 12

#: Seconds between two checkpoints of :func:`train_together` (a save costs a copy of every coalition's model).
CHECKPOINT_S = 60.0

#: Members trained in one stacked program by :func:`train_together` (one client's, sharing its batches).
CHUNK = int(os.environ.get("FEDHET_COALITION_CHUNK", "128"))


@dataclass
class CoalitionUtilities:
    """Per utility (``UTILITIES``), one value per coalition bitmask (index 0: the initial model)."""

    num_clients: int
    utilities: dict[str, np.ndarray]
    wall_s: float
    #: Each coalition's final trainable weights, stacked (row = bitmask − 1), when asked for (tests).
    weights: dict[str, Tensor] | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "num_clients": self.num_clients,
            "utilities": {k: [float(v) for v in u] for k, u in self.utilities.items()},
            "wall_s": self.wall_s,
        }

    @classmethod
    def from_json(cls, blob: dict[str, Any]) -> CoalitionUtilities:
        return cls(
            int(blob["num_clients"]),
            {k: np.asarray(v, dtype=np.float64) for k, v in blob["utilities"].items()},
            float(blob["wall_s"]),
        )


def coalition_config(cfg: ExperimentConfig, members: list[int] | None = None) -> ExperimentConfig:
    """``cfg`` as every coalition is trained: guards off, evaluated once at the end, and (``members``) only
    those clients taking part."""
    out = copy.deepcopy(cfg)
    overrides = [(key, json.dumps(value)) for key, value in GUARDS_OFF.items()]
    overrides += [("eval.every", json.dumps(cfg.train.rounds)), ("eval.every_round_last", "0")]
    overrides.append(("train.participants", json.dumps(members)))
    apply_overrides(out, overrides)
    return out


def check_federation(cfg: ExperimentConfig) -> int:
    """N, after refusing what has no ground truth here: too many clients, partial participation, dropout."""
    n = cfg.data.clients
    if not 2 <= n <= MAX_CLIENTS:
        raise ConfigError(
            f"data.clients = {n}: exact values train all 2^N − 1 coalitions, for 2 to {MAX_CLIENTS} clients "
            "(use an estimator for more: see docs/contributions.md)"
        )
    cpr = cfg.train.clients_per_round
    if (isinstance(cpr, float) and cpr < 1.0) or (isinstance(cpr, int) and cpr < n):
        raise ConfigError(
            f"train.clients_per_round = {cpr}: a coalition's utility is defined with every member taking "
            "part in every round; set train.clients_per_round = 1.0"
        )
    # Attacks of kind "data" are a property of a client's data, not of what it sends: they belong to the
    # federation whose coalitions are valued (a client with wrong labels), and every coalition holding it
    # trains on them.
    acting = sorted({b for b in cfg.faults.clients.values() if attack_class(b).kind != "data"})
    if cfg.train.client_dropout or acting or cfg.train.participants is not None:
        raise ConfigError(
            "train.client_dropout, [faults] other than a client's wrong labels (label-flip) and "
            "train.participants are not part of a coalition's training"
            + (f" (faults given: {', '.join(acting)})" if acting else "")
            + "; plant a role with a split (free-rider, maverick, duplicate) or faults.clients.K = "
            '"label-flip", or leave them out'
        )
    return n


def _evaluate(model: torch.nn.Module, fed: Any, batch_size: int) -> dict[str, float]:
    from fedhet.engine.evaluation import evaluate_model

    metrics = evaluate_model(model, fed.test_x, fed.test_y, fed.num_classes, batch_size)
    return {key: float(metrics[key]) for key in UTILITIES}


def _resume(
    path: Path | None, fingerprint: str, weights: dict[str, Tensor]
) -> tuple[int, dict[str, Tensor], float]:
    """(the round to start from, the stacked weights, seconds already spent) from ``path``'s checkpoint of
    this experiment, else from round 1."""
    if path is None or not path.is_file():
        return 1, weights, 0.0
    saved = torch.load(path, map_location=next(iter(weights.values())).device, weights_only=True)
    if saved.get("experiment") != fingerprint or set(saved["weights"]) != set(weights):
        return 1, weights, 0.0
    return int(saved["round"]) + 1, saved["weights"], float(saved["elapsed_s"])


def _save(path: Path, fingerprint: str, rnd: int, weights: dict[str, Tensor], elapsed: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save({"experiment": fingerprint, "round": rnd, "weights": weights, "elapsed_s": elapsed}, partial)
    partial.replace(path)  # a checkpoint is whole or absent, even when the process is killed mid-write


def _loaded(model: torch.nn.Module, state: dict[str, Tensor]) -> torch.nn.Module:
    model.load_state_dict(state)
    return model


@torch.inference_mode()
def _evaluate_stacked(stack: list[str], weights: dict[str, Tensor], fed: Any, rows: int = 1024):
    """Per coalition, the utilities of its stacked ReLU-stack weights (``stack``: the Linear layers, hidden
    first): the test rows are one input of every coalition (fedhet.models.mlp.stacked_relu_inputs), so each
    layer is one matrix product for all of them. The same numbers as :func:`_evaluate` one model at a time,
    up to float reassociation (tested)."""
    from fedhet import metrics as M
    from fedhet.models.mlp import stacked_relu_inputs

    x_all, y_all = fed.test_x, fed.test_y
    x_all = x_all.reshape(len(x_all), -1)
    count = weights[f"{stack[0]}.weight"].shape[0]
    y_np = y_all.cpu().numpy()
    for first in range(0, count, 64):
        layers = [
            (weights[f"{n}.weight"][first : first + 64], weights[f"{n}.bias"][first : first + 64])
            for n in stack
        ]
        preds, losses = [], []
        for start in range(0, len(x_all), rows):
            x, y = x_all[start : start + rows].unsqueeze(0), y_all[start : start + rows]
            head_w, head_b = layers[-1]
            h = stacked_relu_inputs(layers[:-1], x)[-1]
            logits = torch.baddbmm(head_b.unsqueeze(1), h, head_w.transpose(1, 2))
            preds.append(logits.argmax(-1))
            log_p = torch.log_softmax(logits, -1)
            losses.append(-log_p.gather(-1, y.view(1, -1, 1).expand(len(logits), -1, 1)).squeeze(-1).sum(1))
        pred = torch.cat(preds, 1).cpu().numpy()
        loss = (torch.stack(losses).sum(0) / len(y_all)).tolist()
        for g in range(len(pred)):
            m = M.classification_metrics(pred[g], y_np, fed.num_classes)
            yield {
                "accuracy": float(m["accuracy"]),
                "balanced_accuracy": float(m["balanced_accuracy"]),
                "loss": loss[g],
            }


def together_refusal(cfg: ExperimentConfig) -> str | None:
    """Why the coalitions of ``cfg`` cannot be trained together (None when they can)."""
    if cfg.method.name != "fedavg":
        return f"method {cfg.method.name!r} (the coalitions train together for FedAvg)"
    if cfg.aggregation.rule != "mean" or cfg.aggregation.implementation != "fedhet":
        return f"aggregation.rule = {cfg.aggregation.rule!r} (together: fedhet's weighted mean)"
    if cfg.model.init_from:
        return "model.init_from (a warm start; train one at a time)"
    return None


def train_together(
    cfg: ExperimentConfig,
    *,
    progress: Callable[[int, int], None] | None = None,
    keep_weights: bool = False,
    checkpoint: Path | None = None,
) -> CoalitionUtilities:
    """Every coalition's FedAvg model, trained together (module docstring); refuses what it cannot train.
    ``checkpoint``: a file the stacked weights are saved to (every ``CHECKPOINT_S`` seconds and at the end)
    and resumed from, exactly, when it holds this experiment."""
    from fedhet.algorithms import build_strategy
    from fedhet.engine.faults import fault_data, fault_for
    from fedhet.engine.protocol import LR_KEY, ClientState, Instruction, LocalUpdate
    from fedhet.engine.schedule import learning_rate
    from fedhet.engine.simulation import Simulation
    from fedhet.engine.vectorized import (
        Member,
        index_batches,
        relu_stack_names,
        train_stacked_params,
        why_not_vectorized,
    )

    n = check_federation(cfg)
    reason = together_refusal(cfg)
    if reason:
        raise ConfigError(f"the coalitions cannot be trained together: {reason}; use one_at_a_time")
    cfg = coalition_config(cfg)
    t0 = time.perf_counter()
    strategy = build_strategy(cfg.method.name, cfg.method.params)
    sim = Simulation(cfg, strategy, listeners=[])
    sim.setup()  # the run's data, initial model, trainer and per-round client generators
    trainer, transport, fed = sim.trainer, sim.transport, sim.fed
    model = transport.work_model
    refusal = why_not_vectorized(trainer, model, cfg.train)
    if refusal:
        raise ConfigError(f"the coalitions cannot be trained together: {refusal}; use one_at_a_time")
    initial = {k: v.detach().clone() for k, v in strategy.global_weights().items()}
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    count = (1 << n) - 1
    # (coalition row, client) for every member of a coalition, client by client: a stacked chunk then holds
    # one client's members, which all take its number of steps (a mixed chunk steps as long as its longest)
    pairs = [(mask - 1, i) for i in range(n) for mask in range(1, count + 1) if mask >> i & 1]
    rows = torch.tensor([row for row, _ in pairs], device=sim.device)
    # stacked chunks of one client's members (at most CHUNK): each step's batch is one input of all of them
    firsts = [k for k in range(len(pairs)) if k == 0 or pairs[k][1] != pairs[k - 1][1]] + [len(pairs)]
    chunks = [
        (start, min(start + CHUNK, stop))
        for first, stop in zip(firsts[:-1], firsts[1:], strict=True)
        for start in range(first, stop, CHUNK)
    ]
    # FedAvg's p_i (samples, or uniform), normalised within each coalition (all zero: uniform, as FedAvg)
    if strategy.weighting == "uniform":
        p = np.ones(n)
    else:
        p = np.array([trainer.num_examples(fed.clients[i]) for i in range(n)], dtype=np.float64)
    totals = np.zeros(count)
    sizes = np.zeros(count)
    for row, i in pairs:
        totals[row] += p[i]
        sizes[row] += 1
    share = [p[i] / totals[row] if totals[row] > 0 else 1.0 / sizes[row] for row, i in pairs]
    shares = torch.tensor(share, dtype=torch.float32, device=sim.device)
    weights = {k: initial[k].unsqueeze(0).repeat(count, *([1] * initial[k].dim())) for k in names}
    fingerprint = cfg.run_fingerprint()
    first, weights, elapsed = _resume(checkpoint, fingerprint, weights)
    t0 -= elapsed
    saved = time.perf_counter()
    for rnd in range(first, cfg.train.rounds + 1):
        config = {LR_KEY: learning_rate(cfg, rnd)}
        updates, batches = [], []
        for i in range(n):  # one batch schedule per client, shared by every coalition holding it
            u = LocalUpdate(
                model=model,
                data=fault_data(fault_for(cfg, i, rnd), fed.clients[i]),  # a label-flip client's labels
                instruction=Instruction(weights={}, config=config),
                state=ClientState(),
                context=transport.context(rnd, i),
                start={},
            )
            updates.append(u)
            batches.append(index_batches(trainer, u))
        merged = {k: torch.zeros_like(v) for k, v in weights.items()}
        alone: dict[int, dict[str, Tensor]] = {}
        for start, stop in chunks:
            i = pairs[start][1]
            at = rows[start:stop]
            if rnd == 1:  # every coalition starts from the initial model: client i's update is one for all
                if i not in alone:
                    alone[i] = {k: weights[k][:1].clone() for k in names}
                    member = Member(i, updates[i], batches[i], None, 0.0, None)
                    train_stacked_params(model, [member], cfg.train, alone[i])
                params = {k: v.expand(stop - start, *v.shape[1:]) for k, v in alone[i].items()}
            else:
                members = [Member(i, updates[i], batches[i], None, 0.0, None)] * (stop - start)
                params = {k: weights[k].index_select(0, at) for k in names}
                train_stacked_params(model, members, cfg.train, params, shared_batches=True)
            coef = shares[start:stop]
            for k in names:
                view = (-1, *([1] * (params[k].dim() - 1)))
                merged[k].index_add_(0, at, params[k] * coef.view(view))
        weights = merged
        if checkpoint is not None and (
            rnd == cfg.train.rounds or time.perf_counter() - saved >= CHECKPOINT_S
        ):
            _save(checkpoint, fingerprint, rnd, weights, time.perf_counter() - t0)
            saved = time.perf_counter()
        if progress is not None:
            progress(rnd, cfg.train.rounds)
    utilities = {key: np.empty(count + 1) for key in UTILITIES}
    scratch = copy.deepcopy(model)
    scratch.load_state_dict(initial)
    for key, value in _evaluate(scratch, fed, cfg.eval.batch_size).items():
        utilities[key][0] = value
    stack = relu_stack_names(model, names)
    if stack is not None:
        evaluated = _evaluate_stacked(stack, weights, fed)
    else:
        states = ({**initial, **{k: weights[k][row] for k in names}} for row in range(count))
        evaluated = (_evaluate(_loaded(scratch, state), fed, cfg.eval.batch_size) for state in states)
    for row, metrics in enumerate(evaluated):
        for key, value in metrics.items():
            utilities[key][row + 1] = value
    return CoalitionUtilities(
        n, utilities, time.perf_counter() - t0, weights=weights if keep_weights else None
    )


def train_one_at_a_time(
    cfg: ExperimentConfig,
    *,
    progress: Callable[[int, int], None] | None = None,
    keep_weights: bool = False,
) -> CoalitionUtilities:
    """Every coalition's model by one embedded run of ``cfg``'s method per coalition."""
    from fedhet.algorithms import build_strategy
    from fedhet.experiment import make_simulation

    n = check_federation(cfg)
    t0 = time.perf_counter()
    count = (1 << n) - 1
    utilities = {key: np.empty(count + 1) for key in UTILITIES}
    kept: dict[str, list[Tensor]] = {}
    for mask in range(count + 1):
        members = [i for i in range(n) if mask >> i & 1]
        coalition = coalition_config(cfg, members or None)
        strategy = build_strategy(coalition.method.name, coalition.method.params)
        sim = make_simulation(coalition, strategy=strategy, listeners=[], notify=lambda _message: None)
        if members:
            sim.run()
        else:  # the empty coalition: the initial model, untrained
            sim.setup()
        model = strategy.global_model()
        for key, value in _evaluate(model, sim.fed, coalition.eval.batch_size).items():
            utilities[key][mask] = value
        if keep_weights and members:
            for name, p in model.named_parameters():
                if p.requires_grad:
                    kept.setdefault(name, []).append(p.detach().clone())
        if progress is not None:
            progress(mask + 1, count + 1)
    weights = {k: torch.stack(v) for k, v in kept.items()} if keep_weights else None
    return CoalitionUtilities(n, utilities, time.perf_counter() - t0, weights=weights)


__all__ = [
    "UTILITIES",
    "CoalitionUtilities",
    "coalition_config",
    "train_one_at_a_time",
    "train_together",
]
