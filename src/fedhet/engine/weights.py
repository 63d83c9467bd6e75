"""State-dict helpers shared by trainers and strategies."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from fedhet.engine.protocol import Weights


def clone_weights(weights: Mapping[str, Tensor]) -> Weights:
    """A detached copy of a state dict."""
    return {k: v.detach().clone() for k, v in weights.items()}
