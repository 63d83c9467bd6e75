"""``min-sum`` (Shejwalkar and Houmansadr, NDSS 2021, Sec. 4, "Min-Sum"): the malicious update's sum of
squared distances to the benign updates stays within the largest such sum of a benign update,
Σ_i ‖∇m − ∇_i‖² ≤ max_i Σ_j ‖∇_i − ∇_j‖² (the paper's bound, ``bound = "max"``); ``bound = "min"`` takes
the smallest sum instead, as the authors' released code does. The search and directions:
fedhet.attacks.agr_agnostic."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from fedhet.attacks.agr_agnostic import OptimizedPerturbation, squared_distances


class MinSum(OptimizedPerturbation):
    """mean + γ·∇p, γ the largest with Σ_i ‖∇m − ∇_i‖² ≤ max_i Σ_j ‖∇_i − ∇_j‖²."""

    name = "min-sum"
    parameters = {**OptimizedPerturbation.parameters, "bound": "max"}
    bound: str

    def check(self) -> None:
        super().check()
        if self.bound not in ("max", "min"):
            self.fail(f"bound = {self.bound!r}; choose 'max' (the paper's) or 'min' (the authors' code)")

    def within(self, benign: Tensor) -> Callable[[Tensor], bool]:
        sums = [float(squared_distances(benign, row).sum()) for row in benign]
        limit = max(sums) if self.bound == "max" else min(sums)
        return lambda malicious: float(squared_distances(benign, malicious).sum()) <= limit
