"""``sign-flip``: the update negated, w_sent − (w_i − w_sent)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.attacks.base import Attack


class SignFlip(Attack):
    """Its update negated."""

    name = "sign-flip"
    kind = "reply"

    def tensor(self, trained: Tensor, base: Tensor, generator: torch.Generator) -> Tensor:
        return base - (trained - base)
