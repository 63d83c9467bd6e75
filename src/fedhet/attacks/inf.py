"""``inf``: a large-value attack, every coordinate of the update set to one huge finite ``value`` (default
1e20; finite in float32, whose largest is about 3.4e38, so that it passes the protocol's finiteness check
and reaches the guards and the rule, where an update of +∞ would be rejected at the boundary as ``nan``
is). In float16 weights w_sent + 1e20 overflows to +∞ and is rejected so.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedhet.attacks.base import Attack, RoundView


class Inf(Attack):
    """Every coordinate of the update = ``value``."""

    name = "inf"
    kind = "coordinated"
    parameters = {"value": 1e20}
    value: float

    def check(self) -> None:
        value = self.value
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            self.fail(f"value = {value!r} must be a finite number (e.g. 1e20)")

    def forge(self, view: RoundView) -> dict[int, dict[str, Tensor]]:
        update = {key: torch.full_like(stacked[0], float(self.value)) for key, stacked in view.honest.items()}
        return self.same_for_all(view, update)
