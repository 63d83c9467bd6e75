"""``min-max`` (Shejwalkar and Houmansadr, NDSS 2021, Sec. 4, "Min-Max"): the malicious update's largest
squared distance to a benign update stays within the largest squared distance between two benign updates,
max_i ‖∇m − ∇_i‖² ≤ max_{i,j} ‖∇_i − ∇_j‖². The search and directions: fedhet.attacks.agr_agnostic."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from fedhet.attacks.agr_agnostic import OptimizedPerturbation, squared_distances


class MinMax(OptimizedPerturbation):
    """mean + γ·∇p, γ the largest with max_i ‖∇m − ∇_i‖² ≤ max_{i,j} ‖∇_i − ∇_j‖²."""

    name = "min-max"

    def within(self, benign: Tensor) -> Callable[[Tensor], bool]:
        bound = max(float(squared_distances(benign, row).max()) for row in benign)
        return lambda malicious: float(squared_distances(benign, malicious).max()) <= bound
