"""The shared part of ``min-max`` and ``min-sum`` (Shejwalkar and Houmansadr, "Manipulating the Byzantine:
Optimizing Model Poisoning Attacks and Defenses for Federated Learning", NDSS 2021, Sec. 4): the malicious
update ∇m = mean of the benign updates + γ·∇p, with γ the largest that keeps ∇m within the benign updates'
own spread, found by the paper's halving search (its Algorithm 1).

The perturbation directions ∇p (``direction``): ``"unit-vec"`` −mean/‖mean‖ (inverse unit vector),
``"sign"`` −sign(mean) (inverse sign), ``"std"`` −std (inverse standard deviation, coordinate-wise, the
sample std with Bessel's correction as the authors' code takes it). Vectors are the whole model's updates
flattened (float64): the distances are between whole updates.

The search (Algorithm 1 as the authors' code runs it): γ = γ_init (``gamma_init``, default 10), step
γ_init/2; each iteration keeps γ where it satisfies the bound (γ_succ = γ, γ += step) or lowers it
(γ −= step), then halves the step; it stops when |γ_succ − γ| ≤ τ (``tolerance``, default 1e-5), after
about log2(γ_init/τ) = 20 iterations, and sends mean + γ_succ·∇p. So γ_succ lies in [0, 2·γ_init): γ = 0
(the benign mean) where no γ tried satisfies the bound.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedhet.attacks.base import Attack, RoundView

#: The perturbation directions ∇p a ``direction`` parameter may name.
DIRECTIONS = ("unit-vec", "sign", "std")


def perturbation(benign: Tensor, direction: str) -> Tensor:
    """∇p for the benign updates ``benign`` (h, d): −mean/‖mean‖, −sign(mean) or −std (zero where the mean
    is zero, or a single update has no std)."""
    mean = benign.mean(dim=0)
    if direction == "unit-vec":
        norm = torch.linalg.vector_norm(mean)
        return -mean / norm if norm > 0 else torch.zeros_like(mean)
    if direction == "sign":
        return -torch.sign(mean)
    if benign.shape[0] < 2:
        return torch.zeros_like(mean)
    return -benign.std(dim=0, correction=1)


def squared_distances(rows: Tensor, point: Tensor) -> Tensor:
    """‖rows_i − point‖² for every row."""
    return (rows - point).pow(2).sum(dim=1)


def largest_gamma(
    accepted: Callable[[Tensor], bool], mean: Tensor, direction: Tensor, gamma_init: float, tolerance: float
) -> float:
    """The paper's halving search (Algorithm 1): the largest γ found with ``accepted(mean + γ·direction)``."""
    gamma, step, succeeded = gamma_init, gamma_init / 2, 0.0
    while abs(succeeded - gamma) > tolerance:
        if accepted(mean + gamma * direction):
            succeeded = gamma
            gamma += step
        else:
            gamma -= step
        step /= 2
    return succeeded


class OptimizedPerturbation(Attack):
    """mean + γ·∇p with the largest γ :meth:`within` accepts; ``min-max`` and ``min-sum`` say what it is."""

    kind = "coordinated"
    parameters = {"direction": "std", "gamma_init": 10.0, "tolerance": 1e-5}
    direction: str
    gamma_init: float
    tolerance: float

    def check(self) -> None:
        if self.direction not in DIRECTIONS:
            self.fail(f"direction = {self.direction!r}; choose one of {list(DIRECTIONS)}")
        for key in ("gamma_init", "tolerance"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                self.fail(f"{key} = {value!r} must be a number > 0")

    def within(self, benign: Tensor) -> Callable[[Tensor], bool]:
        """The bound a malicious update must satisfy, given the benign updates (h, d)."""
        raise NotImplementedError

    def forge(self, view: RoundView) -> dict[int, dict[str, Tensor]]:
        benign = view.flat_honest()
        mean = benign.mean(dim=0)
        direction = perturbation(benign, self.direction)
        gamma = largest_gamma(self.within(benign), mean, direction, self.gamma_init, self.tolerance)
        return self.same_for_all(view, view.unflatten(mean + gamma * direction))
