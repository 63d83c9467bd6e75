"""Evaluation of a model on in-memory tensors: logits, accuracy and the papers' classification metrics; the
accuracies of many weight sets of one architecture in one batched pass (:func:`accuracies_of_states`); and
the evaluation the round loop adds to a round's metrics line (:func:`evaluate_round`)."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet import metrics as M

if TYPE_CHECKING:
    from fedhet.config_sections import EvalConfig
    from fedhet.engine.protocol import Strategy

log = logging.getLogger(__name__)

# Private switch of accuracies_of_states: True stacks the weight sets (vmap), False evaluates them one at a
# time, None (the default) stacks them on an accelerator only. On CPU the reward evaluation of mlp200 is
# matrix products at the core's peak rate, and the stacked products measured 0.8-1.0x the plain loop
# (benchmarks/fedrac_row.py); on a GPU one pass replaces M kernel launches per layer. Not a setting: both
# paths give the same numbers (tested), the benchmark sets it to compare them.
_BATCHED_STATES: bool | None = None
# Model-samples one stacked forward may hold (models x rows): with the default evaluation batch (2,048 rows)
# up to 8 models go through at once, so the activations stay bounded whatever the number of clients.
_STACKED_ROWS = 1 << 14


@torch.inference_mode()
def predict(model: nn.Module, x: Tensor, batch_size: int = 2048) -> tuple[Tensor, Tensor]:
    """Logits of ``model`` on ``x`` in eval mode (the previous train/eval mode is restored), batched under
    ``torch.inference_mode`` on the model's device: the outputs are for metrics only, never for autograd."""
    was_training = model.training
    model.eval()
    try:
        out = [model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    finally:
        model.train(was_training)
    logits = torch.cat(out) if out else torch.empty(0)
    return logits, logits.argmax(dim=1)


def evaluate_model(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    num_classes: int,
    batch_size: int = 2048,
    rare_classes: list[int] | None = None,
) -> dict[str, Any]:
    """Loss, accuracy, balanced accuracy, per-class recall (and rare-class recall) on (x, y)."""
    logits, pred = predict(model, x, batch_size)
    out = M.classification_metrics(
        pred.cpu().numpy(), y.cpu().numpy(), num_classes, rare_classes=rare_classes
    )
    out["loss"] = float(nn.functional.cross_entropy(logits, y))
    return out


def accuracy_of(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 2048) -> float:
    _, pred = predict(model, x, batch_size)
    return float((pred == y).float().mean()) if len(y) else float("nan")


def accuracies_of_states(
    model: nn.Module, states: Sequence[Mapping[str, Tensor]], x: Tensor, y: Tensor, batch_size: int = 2048
) -> list[float]:
    """The accuracy on (x, y) of ``model``'s architecture under each of ``states`` (full state dicts), in
    eval mode. On an accelerator the states are stacked and evaluated together by ``torch.func.vmap`` over
    ``functional_call`` (BatchNorm uses its running statistics), at most ``_STACKED_ROWS // batch_size`` at
    a time; on CPU one at a time (see ``_BATCHED_STATES``). Either equals :func:`accuracy_of` per state up
    to float reassociation (an argmax may flip on a near-tie; tested). ``model``'s weights are not used,
    its masks and train/eval mode are (and left as they were)."""
    if not states:
        return []
    if len(y) == 0:
        return [float("nan")] * len(states)
    batched = _BATCHED_STATES if _BATCHED_STATES is not None else x.device.type != "cpu"
    if not batched or len(states) == 1:
        return _accuracies_one_at_a_time(model, states, x, y, batch_size)
    groups = math.ceil(len(states) / max(1, _STACKED_ROWS // max(1, batch_size)))
    size = math.ceil(len(states) / groups)  # equal groups: 10 states in 2 groups of 5, not 8 + 2
    correct: list[Tensor] = []
    for start in range(0, len(states), size):
        chunk = states[start : start + size]
        try:
            correct.append(_stacked_correct(model, chunk, x, y, batch_size))
        except RuntimeError as exc:
            # vmap refuses some models (data-dependent control flow, .item(), in-place updates of an input,
            # ops without a batching rule): those take the one-at-a-time path, which gives the same numbers.
            log.info(
                "evaluating %s one state at a time (vmap cannot batch it: %s)", type(model).__name__, exc
            )
            return _accuracies_one_at_a_time(model, states, x, y, batch_size)
    # float32 division, as accuracy_of does, so equal counts give identical numbers on both paths.
    return (torch.cat(correct).to(torch.float32) / len(y)).tolist()


def _accuracies_one_at_a_time(
    model: nn.Module, states: Sequence[Mapping[str, Tensor]], x: Tensor, y: Tensor, batch_size: int
) -> list[float]:
    """Load each state into a copy of ``model`` and evaluate it (the unbatched path)."""
    scratch = copy.deepcopy(model)
    out = []
    for state in states:
        scratch.load_state_dict(state)
        out.append(accuracy_of(scratch, x, y, batch_size))
    return out


@torch.inference_mode()
def _stacked_correct(
    model: nn.Module, states: Sequence[Mapping[str, Tensor]], x: Tensor, y: Tensor, batch_size: int
) -> Tensor:
    """Correct predictions on (x, y) of each of ``states`` (M,), all M evaluated in each batch."""
    from torch.func import functional_call, vmap

    keys = list(model.state_dict())
    missing = [k for k in keys if any(k not in s for s in states)]
    if missing:
        raise KeyError(f"states lack the model's entries {missing[:3]}: pass full state dicts")
    stacked = {k: torch.stack([s[k] for s in states]) for k in keys}

    def predictions(weights: dict[str, Tensor], xb: Tensor) -> Tensor:
        return functional_call(model, weights, (xb,)).argmax(-1)

    batched = vmap(predictions, in_dims=(0, None))
    correct = torch.zeros(len(states), dtype=torch.long, device=x.device)
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(x), batch_size):
            correct += (batched(stacked, x[i : i + batch_size]) == y[i : i + batch_size]).sum(1)
    finally:
        model.train(was_training)
    return correct


def evaluate_round(
    strategy: Strategy,
    x: Tensor,
    y: Tensor,
    num_classes: int,
    settings: EvalConfig,
    *,
    rare_classes: list[int] | None = None,
    reference: Sequence[float] | np.ndarray | None = None,
) -> dict[str, Any]:
    """A round's evaluation on the test set (x, y): the global model's metrics (:func:`evaluate_model`), the
    accuracy of each client's reward model and the best of them, and with the standalone accuracies
    (``reference``) the fairness of the rewards (Pearson, Spearman, BCF rate, IPR) and of the contributions.
    A method without a global model (Standalone) reports its clients' mean reward accuracy as accuracy."""
    out: dict[str, Any] = {}
    model = strategy.global_model()
    if model is not None:
        out.update(evaluate_model(model, x, y, num_classes, settings.batch_size, rare_classes))
    rewards = None
    if settings.rewards and strategy.has_rewards():
        rewards = strategy.evaluate_rewards(x, y, settings.batch_size)
    if rewards is not None:
        out["rewards"] = [float(r) for r in rewards]
        finite_rewards = [r for r in rewards if math.isfinite(r)]
        if finite_rewards:  # the best participant's model (CFFL's reference metric)
            out["best_reward_accuracy"] = float(max(finite_rewards))
        if model is None:  # e.g. Standalone: report the clients' mean accuracy
            finite = [r for r in rewards if math.isfinite(r)]
            out["accuracy"] = float(np.mean(finite)) if finite else float("nan")
        if reference is not None and np.all(np.isfinite(rewards)):
            out["fairness_pearson"] = M.fairness(reference, rewards, "pearson")
            out["fairness_spearman"] = M.fairness(reference, rewards, "spearman")
            out["bcf_rate"] = M.bcf_rate(reference, rewards, settings.bcf_alpha)
            out["bcf_rate_code"] = M.bcf_rate_fedrac_code(reference, rewards, settings.bcf_alpha)
            out["ipr"] = M.incentivized_participation_rate(reference, rewards)
    contrib = strategy.contributions()
    if contrib is not None and reference is not None:
        out["contribution_fairness_pearson"] = M.fairness(contrib, reference, "pearson")
    return out
