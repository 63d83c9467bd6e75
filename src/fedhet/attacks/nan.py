"""``nan``: NaN weights (a broken client; the protocol checks reject it)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.attacks.base import Attack


class NaNWeights(Attack):
    """NaN in every float tensor."""

    name = "nan"
    kind = "reply"

    def tensor(self, trained: Tensor, base: Tensor, generator: torch.Generator) -> Tensor:
        return torch.full_like(trained, float("nan"))
