"""State-dict helpers shared by trainers and strategies."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from torch import Tensor

from fedhet.engine.protocol import Weights


def clone_weights(weights: Mapping[str, Tensor]) -> Weights:
    """A detached copy of a state dict."""
    return {k: v.detach().clone() for k, v in weights.items()}


def weights_digest(weights: Mapping[str, Tensor]) -> str:
    """SHA-256 of a state dict: every entry's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach().cpu().contiguous()
        h.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(tensor.numpy().tobytes() if tensor.numel() else b"")
    return h.hexdigest()
