"""``stale``: the model it was sent, unchanged (the plain free rider of Lin et al. 2019 and Fraboni et al.
2021; a zero update where the trainer uploads updates)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.attacks.base import Attack


class Stale(Attack):
    """The model it was sent: a free rider."""

    name = "stale"
    kind = "reply"

    def tensor(self, trained: Tensor, base: Tensor, generator: torch.Generator) -> Tensor:
        return base.clone()
