"""The weighted average of client models, FedAvg's aggregate: one implementation for the server (FedAvg and
every method built on it) and for the models the contribution estimators rebuild from a round's replies
(fedhet.contributions), so that their "all clients" model is FedAvg's, bit for bit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor


def weighted_average(
    states: Sequence[Mapping[str, Tensor]], weights: Sequence[float] | np.ndarray
) -> dict[str, Tensor]:
    """Convex combination Σ_i p_i w_i of state dicts, p_i = weights_i / Σ_j weights_j, added in the given
    order (integer buffers, e.g. BatchNorm's counters: the first's)."""
    total = float(np.sum(weights))
    if total <= 0:
        raise ValueError(f"aggregation weights must sum to a positive number, got {list(weights)}")
    probs = [float(w) / total for w in weights]
    out: dict[str, Tensor] = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = first.clone()
            continue
        acc = torch.zeros_like(first)
        for p, sd in zip(probs, states, strict=True):
            if p != 0.0:
                acc.add_(sd[key], alpha=p)
        out[key] = acc
    return out


__all__ = ["weighted_average"]
