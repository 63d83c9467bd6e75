"""``scale``: the update multiplied by ``faults.factor`` (explicit boosting, Bhagoji et al., "Analyzing
Federated Learning through an Adversarial Lens", ICML 2019, Sec. 3): w_sent + factor · (w_i − w_sent)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.attacks.base import Attack


class Scale(Attack):
    """Its update × factor."""

    name = "scale"
    kind = "reply"
    flat_parameters = ("factor",)
    factor: float

    def tensor(self, trained: Tensor, base: Tensor, generator: torch.Generator) -> Tensor:
        return base + self.factor * (trained - base)
