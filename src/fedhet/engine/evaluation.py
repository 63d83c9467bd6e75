"""Evaluation of a model on in-memory tensors: logits, accuracy and the papers' classification metrics."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fedhet import metrics as M


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
