"""FedRS (Li & Zhan, KDD 2021): restricted softmax for label-skewed clients (baselines.md §2.9).

Client i trains with cross-entropy on restricted logits s_c · z_c, where z_c is the model's logit of class
c and s_c = 1 for classes present in its data and α for absent ones (the paper's form, the default,
``fedrs_scaling='paper'``). The authors' code (lxcnju/FedRepo ``algorithms/fedrs.py``) uses the graded
s_c = α + (1 − α)·n_c / max_k n_k instead (``fedrs_scaling='code'``). The server is unchanged, so the loss
combines with any strategy: :class:`FedRS` is FedAvg + the loss, ``celm-rs`` is CELM + the loss
(:class:`fedhet.algorithms.celm.CELMRS`), and :func:`with_restricted_softmax` adds it to any trainer.

[ours] FedRepo's classifier has no bias (it scales w_c·h). fedhet heads have a bias, and we scale the
whole logit z_c = w_c·h + b_c, which equals the paper's formula when the bias is zero.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fedhet.algorithms.fedavg import FedAvg, SGDTrainer
from fedhet.algorithms.params import check_choice, check_number
from fedhet.engine.protocol import Instruction, LocalUpdate, Trainer
from fedhet.errors import ProtocolError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

FEDRS_SCALINGS = ("paper", "code")
#: Instruction.config keys through which the server sets the client loss (Flower-compatible scalars).
ALPHA_KEY = "fedrs_alpha"
SCALING_KEY = "fedrs_scaling"


def check_fedrs_params(alpha: float, scaling: str) -> tuple[float, str]:
    """Validate FedRS's α ∈ [0, 1] and the scaling form; return them (α as float)."""
    alpha = check_number(
        "fedrs_alpha",
        alpha,
        0.0,
        1.0,
        hint="the scale of absent classes' logits; the paper's grid is 0.9, 0.5, 0.1, default 0.5",
    )
    scaling = check_choice(
        "fedrs_scaling",
        scaling,
        FEDRS_SCALINGS,
        hint="'paper': s_c = 1 present / alpha absent; 'code': s_c = alpha + (1-alpha)*n_c/max n",
    )
    return alpha, scaling


def class_scales(class_counts: Tensor, alpha: float, scaling: str = "paper") -> Tensor:
    """FedRS's per-class logit scales s (K,) from a client's class counts n (K,).

    'paper': s_c = 1 if n_c > 0 else α; 'code' (FedRepo): s_c = α + (1 − α)·n_c / max_k n_k.
    A client without data gets α for every class.
    """
    alpha, scaling = check_fedrs_params(alpha, scaling)
    counts = class_counts.to(torch.float32)
    if scaling == "paper":
        return torch.where(counts > 0, torch.ones_like(counts), torch.full_like(counts, alpha))
    top = counts.max() if counts.numel() else counts.new_tensor(0.0)
    if float(top) <= 0:
        return torch.full_like(counts, alpha)
    return alpha + (1.0 - alpha) * counts / top


def restricted_cross_entropy(logits: Tensor, labels: Tensor, scales: Tensor) -> Tensor:
    """FedRS loss: mean over the batch of −log softmax(s ⊙ z)_y (restricted softmax, Li & Zhan Eq. 6)."""
    return nn.functional.cross_entropy(logits * scales.to(device=logits.device, dtype=logits.dtype), labels)


class FedRSTrainer(SGDTrainer):
    """Supervised SGD with the FedRS restricted-softmax cross-entropy.

    α and the scaling form come from ``Instruction.config`` (``fedrs_alpha``, ``fedrs_scaling``), the class
    counts from the client's own data; the scales are fixed once per local update.
    """

    functional_form = "restricted"  # the logits scaled by u.scratch.fedrs_scales

    def prepare(self, u: LocalUpdate) -> None:
        super().prepare(u)
        missing = [k for k in (ALPHA_KEY, SCALING_KEY) if k not in u.config]
        if missing:
            raise ProtocolError(
                f"the FedRS client loss needs {missing} in the instruction config; "
                "pair it with a FedRS strategy"
            )
        scales = class_scales(u.data.class_counts(), float(u.config[ALPHA_KEY]), str(u.config[SCALING_KEY]))
        u.scratch.fedrs_scales = scales.to(u.context.device)

    def loss(self, u: LocalUpdate, batch: Any) -> Tensor:
        """Cross-entropy on the restricted logits s ⊙ z."""
        x, y = batch
        return restricted_cross_entropy(u.model(x), y, u.scratch.fedrs_scales)


def with_restricted_softmax(trainer_class: type[Trainer]) -> type[Trainer]:
    """``trainer_class`` with FedRS's loss in place of its cross-entropy.

    Works for trainers whose ``loss`` builds on ``super().loss`` (e.g. a proximal term added to CE): the
    FedRS loss sits between them and the SGD trainer in the MRO.
    """
    if issubclass(trainer_class, FedRSTrainer):
        return trainer_class
    if trainer_class is SGDTrainer:
        return FedRSTrainer
    return type(f"{trainer_class.__name__}WithFedRS", (trainer_class, FedRSTrainer), {})


class RestrictedSoftmaxMixin:
    """Strategy mixin that sends the FedRS client loss's settings (``fedrs_alpha``, ``fedrs_scaling``) to
    every client. Put it before the strategy in the bases and pair the class with a FedRS trainer, e.g.
    ``trainer_class = with_restricted_softmax(CELM.trainer_class)``.
    """

    def __init__(self, fedrs_alpha: float = 0.5, fedrs_scaling: str = "paper", **kwargs: Any) -> None:
        self.fedrs_alpha, self.fedrs_scaling = check_fedrs_params(fedrs_alpha, fedrs_scaling)
        super().__init__(**kwargs)

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        instructions = super().configure(rnd, client_ids)
        for ins in instructions.values():
            ins.config[ALPHA_KEY] = self.fedrs_alpha
            ins.config[SCALING_KEY] = self.fedrs_scaling
        return instructions


class FedRS(RestrictedSoftmaxMixin, FedAvg):
    """FedRS: FedAvg (sample-count weights) with the restricted-softmax client loss, α = 0.5 by default."""

    name = "fedrs"
    trainer_class = FedRSTrainer
