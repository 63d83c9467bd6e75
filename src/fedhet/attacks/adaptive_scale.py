"""``adaptive-scale``: explicit boosting (Bhagoji et al., "Analyzing Federated Learning through an
Adversarial Lens", ICML 2019, Sec. 3) tuned to the defence, as adaptive attacks are (Shejwalkar and
Houmansadr, NDSS 2021): each colluder's own update scaled to 0.99 × the update-norm guard's bound."""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

from fedhet.attacks.base import Attack, RoundView

#: ``adaptive-scale`` aims at this fraction of the update-norm guard's bound (a margin for rounding).
ADAPTIVE_MARGIN = 0.99


class AdaptiveScale(Attack):
    """Its own update × 0.99 · k · M / ‖Δ‖: the longest the update-norm guard still accepts."""

    name = "adaptive-scale"
    kind = "coordinated"
    after_others = True
    flat_parameters = ("factor",)
    factor: float

    def forge(self, view: RoundView) -> dict[int, dict[str, Tensor]]:
        factors = self.factors(view)
        return {c: {key: factors[c] * delta for key, delta in view.own[c].items()} for c in view.colluders}

    def factors(self, view: RoundView) -> dict[int, float]:
        """Each colluder's factor: ``ADAPTIVE_MARGIN`` × k × M / ‖Δ‖, M the scale the guard will take: the
        median over the round's norms (the colluders' counted above every other, where their scaled norms
        will be), or the guard's floor where that is larger. ``faults.factor`` where the guard does not
        judge: off, too few updates, a zero median, or colluders holding half the round (the median is then
        theirs)."""
        norms, scalers, k = view.norms, view.colluders, view.guard.factor
        others = [v for cid, v in norms.items() if cid not in scalers]
        median = float(np.median(others + [math.inf] * len(scalers))) if norms else math.nan
        judged = k and len(norms) >= view.guard.min_updates and math.isfinite(median) and median > 0
        out = {}
        for c in scalers:
            if not judged:
                out[c] = self.factor
            else:
                scale = max(median, view.guard.floor)
                out[c] = ADAPTIVE_MARGIN * k * scale / norms[c] if norms[c] > 0 else 1.0
        return out
