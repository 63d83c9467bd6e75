"""``mimic`` (Karimireddy, He and Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via
Bucketing", ICLR 2022, Sec. 5 and their code's MimicAttacker / MimicVariantAttacker): every colluder sends
a copy of one honest client's update, over-weighting that client's data, which robust rules cannot tell
from honest heterogeneity.

Which client (``target``): ``"variance"`` (default) the honest client whose update lies farthest from the
honest mean along the honest updates' direction of largest variance, |⟨z, Δ_i − μ⟩| largest with z the first
principal direction of this round's honest updates: the paper's variant, its warm-up shortened to the round
itself, so the choice is stateless (resumable) and free of z's sign; ties go to the lowest client id. An
integer: that client (the paper's plain mimic); in a round where it sent no honest update the colluders
send their own honest updates.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.attacks.base import Attack, RoundView


def variance_target(benign: Tensor) -> int:
    """The row of ``benign`` (h, d) farthest from the mean along the first principal direction: the
    largest |u_i| of the top eigenvector u of the centred Gram matrix (X_c z = √λ·u for z ∝ X_cᵀu)."""
    centred = benign - benign.mean(dim=0)
    values, vectors = torch.linalg.eigh(centred @ centred.T)
    if not values[-1] > 0:
        return 0
    return int(torch.argmax(vectors[:, -1].abs()))


class Mimic(Attack):
    """Every colluder copies one honest client's update."""

    name = "mimic"
    kind = "coordinated"
    parameters = {"target": "variance"}
    target: str | int

    def check(self) -> None:
        ok = self.target == "variance" or (isinstance(self.target, int) and not isinstance(self.target, bool))
        if not ok or (isinstance(self.target, int) and self.target < 0):
            self.fail(f"target = {self.target!r}; choose 'variance' or a client id (an integer >= 0)")

    def forge(self, view: RoundView) -> dict[int, dict[str, Tensor]]:
        ids = view.honest_ids
        if self.target == "variance":
            row = variance_target(view.flat_honest())
        elif self.target in ids and self.target not in view.colluders:
            row = ids.index(self.target)
        else:
            return {c: dict(view.own[c]) for c in view.colluders}
        return self.same_for_all(view, {key: stacked[row] for key, stacked in view.honest.items()})
