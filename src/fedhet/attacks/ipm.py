"""``ipm``: Inner Product Manipulation, Xie et al., "Fall of Empires: Breaking Byzantine-tolerant SGD by
Inner Product Manipulation", UAI 2019 (PMLR 115, 2020; Sec. 4): each colluder sends −ε × the mean honest
update (``faults.epsilon``: 0.5 a small ε; e.g. 100 the "large ε" variant)."""

from __future__ import annotations

from torch import Tensor

from fedhet.attacks.base import Attack, RoundView


class IPM(Attack):
    """−ε · (1/|honest|) Σ Δ_i."""

    name = "ipm"
    kind = "coordinated"
    flat_parameters = ("epsilon",)
    epsilon: float

    def forge(self, view: RoundView) -> dict[int, dict[str, Tensor]]:
        update = {key: -self.epsilon * stacked.mean(dim=0) for key, stacked in view.honest.items()}
        return self.same_for_all(view, update)
