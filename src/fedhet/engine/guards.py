"""Server-side guards on the updates of a round (``[guards]``; docs/reliability.md).

The protocol checks of :mod:`fedhet.engine.boundary` judge each reply alone (keys, shapes, finite values).
The guards here judge a reply against the round's others: an update whose norm, or a sample count that is
far above the round's median, is what a scaled, random or lying client sends. Each returns the rejected
clients with the reason, which the round loop logs and records like any rejected update.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.config import GuardsConfig
from fedhet.engine.protocol import Instruction, Reply

#: The median of fewer updates than this says nothing about any one of them.
MIN_UPDATES_FOR_MEDIAN = 3


def update_norm(reply: Reply, sent: Instruction | None) -> float:
    """‖w_i − w_sent‖₂ over the floating-point tensors the server sent in full (``sent.weights``); where it
    sent none, or an increment to a model only the client holds (``delta``), ‖w_i‖₂."""
    reference = {} if sent is None or sent.delta else sent.weights
    total = 0.0
    for key, value in reply.weights.items():
        if not value.is_floating_point():
            continue
        base = reference.get(key)
        diff = value if base is None else value - base.to(value.device, value.dtype)
        total += float(diff.detach().double().pow(2).sum())
    return math.sqrt(total)


def guard_updates(
    replies: Mapping[int, Reply], sent: Mapping[int, Instruction], guards: GuardsConfig
) -> dict[int, str]:
    """The replies the guards reject, with the reason: num_examples above ``max_num_examples`` or above
    ``num_examples_factor`` × the round's median, an update norm above ``update_norm_factor`` × the median."""
    rejected: dict[int, str] = {}
    if guards.max_num_examples is not None:
        for cid, reply in replies.items():
            if reply.num_examples > guards.max_num_examples:
                rejected[cid] = (
                    f"num_examples={reply.num_examples} exceeds guards.max_num_examples="
                    f"{guards.max_num_examples}"
                )
    if guards.num_examples_factor is not None:
        counts = {cid: float(r.num_examples) for cid, r in replies.items()}
        rejected.update(_above_median(counts, guards.num_examples_factor, "num_examples", rejected))
    if guards.update_norm_factor is not None:
        norms = {cid: update_norm(r, sent.get(cid)) for cid, r in replies.items() if cid not in rejected}
        rejected.update(_above_median(norms, guards.update_norm_factor, "update norm", rejected))
    return rejected


def _above_median(
    values: Mapping[int, float], factor: float, what: str, already: Mapping[int, str]
) -> dict[int, str]:
    """The clients whose value exceeds ``factor`` × the median over the round (3 or more values)."""
    if len(values) < MIN_UPDATES_FOR_MEDIAN:
        return {}
    median = float(np.median(list(values.values())))
    bound = factor * median
    return {
        cid: f"{what} {v:.4g} exceeds {factor:g} × the round's median {median:.4g}"
        for cid, v in values.items()
        if cid not in already and v > bound
    }


def model_is_finite(model: nn.Module | None) -> bool:
    """Whether every floating-point parameter and buffer of ``model`` is finite (True for no model)."""
    if model is None:
        return True
    tensors: list[Tensor] = [*model.parameters(), *model.buffers()]
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())
