"""``alie``: "A Little Is Enough", Baruch et al., NeurIPS 2019 (Sec. 3): each colluder sends the
coordinate-wise mean − z·std of the honest updates (σ the population std), z_max = Φ⁻¹((n − s)/n),
s = ⌊n/2 + 1⌋ − f for n replies of which f are the colluders'; ``faults.z`` overrides it."""

from __future__ import annotations

import math
import statistics

from torch import Tensor

from fedhet.attacks.base import Attack, RoundView


def alie_z(n: int, f: int) -> float:
    """ALIE's z_max (Baruch et al. 2019, Sec. 3): Φ⁻¹((n − s)/n) with s = ⌊n/2 + 1⌋ − f, for ``n`` updates
    of which ``f`` are the colluders'. With a majority of colluders (s < 1) s = 1; with n = 1, z = 0."""
    s = max(math.floor(n / 2 + 1) - f, 1)
    p = (n - s) / n
    return statistics.NormalDist().inv_cdf(p) if p > 0 else 0.0


class ALIE(Attack):
    """mean − z·std of the honest updates, coordinate-wise."""

    name = "alie"
    kind = "coordinated"
    flat_parameters = ("z",)
    z: float | None

    def forge(self, view: RoundView) -> dict[int, dict[str, Tensor]]:
        z = self.z if self.z is not None else alie_z(view.replies, len(view.colluders))
        update = {}
        for key, stacked in view.honest.items():
            update[key] = stacked.mean(dim=0) - z * stacked.std(dim=0, correction=0)
        return self.same_for_all(view, update)
