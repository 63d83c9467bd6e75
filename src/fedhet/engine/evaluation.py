"""Evaluation of a model on in-memory tensors: logits, accuracy and the papers' classification metrics; and
the evaluation the round loop adds to a round's metrics line (:func:`evaluate_round`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet import metrics as M

if TYPE_CHECKING:
    from fedhet.config_sections import EvalConfig
    from fedhet.engine.protocol import Strategy


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
