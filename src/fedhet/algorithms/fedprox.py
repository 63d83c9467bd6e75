"""FedProx (Li et al., MLSys 2020): FedAvg with the proximal term μ/2·‖w − w_g‖² in local training.

Spec: baselines.md §3.2 and §3.5. ``fedprox`` is the plain supervised trainer plus the term, for any split
(on ``labeled-unlabeled`` it trains on the labeled samples, unaugmented). ``fedprox-labeled`` is the FSSL
table's labeled-only FedProx: ``fedavg-labeled``'s trainer (labeled samples, the protocol's weak view) plus
the term, μ = 0.001 (``lambda_prox`` of the SAGE/ProxyFL options). ``fedprox-fixmatch`` is FixMatch-LPL plus
the same term. The term is a trainer mixin (:class:`ProximalMixin`) so all three reuse one implementation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fedhet.algorithms.fedavg import FedAvg, SGDTrainer
from fedhet.algorithms.fixmatch import FixMatchLPL, FixMatchTrainer, LabeledOnlyTrainer
from fedhet.algorithms.params import check_number
from fedhet.engine.protocol import Instruction, LocalUpdate

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

#: baselines.md §3.2: ``lambda_prox`` = 0.001 in the FSSL protocol.
DEFAULT_MU = 0.001
_CONFIG_KEY = "proximal_mu"


def proximal_term(model: nn.Module, reference: dict[str, Tensor]) -> Tensor:
    """‖w − w_g‖² summed over the trainable parameters named in ``reference`` (FedProx eq. 2 without μ/2)."""
    total = None
    for name, param in model.named_parameters():
        if name in reference and param.requires_grad:
            term = (param - reference[name]).pow(2).sum()
            total = term if total is None else total + term
    if total is None:
        return torch.zeros(())
    return total


class ProximalMixin:
    """Adds μ/2·‖w − w_g‖² to a trainer's loss, w_g = the weights local training started from (the round's
    global model); μ comes from ``Instruction.config['proximal_mu']``."""

    def prepare(self, u: LocalUpdate) -> None:
        super().prepare(u)
        u.scratch.proximal_mu = float(u.config.get(_CONFIG_KEY, DEFAULT_MU))
        u.scratch.proximal_reference = {
            name: p.detach().clone() for name, p in u.model.named_parameters() if p.requires_grad
        }

    def loss(self, u: LocalUpdate, batch: Any) -> Tensor:
        base = super().loss(u, batch)
        mu = u.scratch.proximal_mu
        if mu == 0.0:
            return base
        return base + 0.5 * mu * proximal_term(u.model, u.scratch.proximal_reference)


class FedProxTrainer(ProximalMixin, SGDTrainer):
    """Supervised SGD with the proximal term."""

    functional_form = "proximal"  # μ from u.scratch.proximal_mu, the reference = the start weights


class FedProxLabeledTrainer(ProximalMixin, LabeledOnlyTrainer):
    """The labeled-only trainer (labeled samples, weak view) with the proximal term."""


class FedProxFixMatchTrainer(ProximalMixin, FixMatchTrainer):
    """FixMatch local update with the proximal term."""


class ProximalStrategyMixin:
    """The server side of the proximal term: checks μ and sends it to every client
    (``Instruction.config['proximal_mu']``, read by :class:`ProximalMixin`)."""

    def __init__(self, mu: float = DEFAULT_MU, **kw: Any) -> None:
        super().__init__(**kw)
        self.mu = check_number("mu", mu, 0.0, hint="FedProx μ; the FSSL table uses 0.001")

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        instructions = super().configure(rnd, client_ids)
        for ins in instructions.values():
            ins.config[_CONFIG_KEY] = self.mu
        return instructions


class FedProx(ProximalStrategyMixin, FedAvg):
    """FedProx: FedAvg + (μ/2)‖w − w_g‖² locally; on the labeled-unlabeled split, labeled data only."""

    name = "fedprox"
    trainer_class = FedProxTrainer


class FedProxLabeled(FedProx):
    """FedProx on the labeled samples only, weak view (the FSSL table's FedProx row, baselines.md §3.2)."""

    name = "fedprox-labeled"
    trainer_class = FedProxLabeledTrainer


class FedProxFixMatch(ProximalStrategyMixin, FixMatchLPL):
    """FedProx + FixMatch (baselines.md §3.5): FixMatch-LPL with the proximal term, μ = 0.001."""

    name = "fedprox-fixmatch"
    trainer_class = FedProxFixMatchTrainer
