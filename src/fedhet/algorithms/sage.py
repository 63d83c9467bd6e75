"""SAGE (Liu et al., CVPR 2025, "Mind the Gap"): confidence-discrepancy soft correction of pseudo-labels.

Spec: baselines.md §3.6 (Jay-Codeman/SAGE ``SAGE.py::Local.fixmatch_train``). Per unlabeled sample, with
c_L, ŷ_L the local model's confidence and label on the weak view and c_G, ŷ_G the frozen global model's:
Δ = clamp(|c_L − c_G| + 1e-6, 1e-6, 1), λ = clamp(exp(−κΔ), 1e-6, 1) with κ = ln 2 / 0.05 (λ = 0.5 at
Δ = 0.05); target t = λ·onehot(ŷ_L) + (1 − λ)·onehot(ŷ_G) where c_L ≥ τ, else onehot(ŷ_G); mask =
[c_L ≥ τ] ∨ [c_G ≥ τ]; L_u = mean m·KL(t ‖ softmax(strong logits)). The server is plain FedAvg.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.algorithms.fixmatch import FixMatchTrainer, SemiSupervised
from fedhet.algorithms.fssl import PseudoTargets, SemiSupervisedStep
from fedhet.algorithms.params import check_number
from fedhet.engine.protocol import ConfigValue, LocalUpdate
from fedhet.errors import ConfigError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

#: κ = ln 2 / 0.05 (the code's constant; its ``--kappa 0.5`` option is unused).
DEFAULT_DISCREPANCY_SCALE = math.log(2.0) / 0.05
_CONFIG_KEY = "sage.discrepancy_scale"


def sage_targets(
    local_probs: Tensor, global_probs: Tensor, *, threshold: float, discrepancy_scale: float
) -> PseudoTargets:
    """SAGE's confidence-driven soft correction (baselines.md §3.6): targets, OR mask, argmax labels."""
    num_classes = local_probs.shape[1]
    local_conf, local_label = local_probs.max(dim=1)
    global_conf, global_label = global_probs.max(dim=1)
    delta = torch.clamp((local_conf - global_conf).abs() + 1e-6, min=1e-6, max=1.0)
    weight = torch.clamp(torch.exp(-discrepancy_scale * delta), min=1e-6, max=1.0).unsqueeze(1)
    local_hot = F.one_hot(local_label, num_classes).to(local_probs.dtype)
    global_hot = F.one_hot(global_label, num_classes).to(local_probs.dtype)
    local_confident = local_conf >= threshold
    targets = torch.where(
        local_confident.unsqueeze(1), weight * local_hot + (1.0 - weight) * global_hot, global_hot
    )
    mask = local_confident | (global_conf >= threshold)
    return PseudoTargets(targets=targets, mask=mask.to(local_probs.dtype), labels=targets.argmax(dim=1))


class SAGETrainer(FixMatchTrainer):
    """FixMatch with SAGE's corrected targets in place of the hard global pseudo-labels."""

    def make_pseudo_targets(self, u: LocalUpdate, step: SemiSupervisedStep) -> PseudoTargets:
        return sage_targets(
            step.local_probs,
            step.global_probs,
            threshold=u.scratch.settings.threshold,
            discrepancy_scale=float(u.config.get(_CONFIG_KEY, DEFAULT_DISCREPANCY_SCALE)),
        )


class SAGE(SemiSupervised):
    """SAGE: FedAvg + FixMatch with confidence-discrepancy soft targets mixing local and global labels.

    ``discrepancy_scale`` κ = ln 2 / 0.05 ≈ 13.86. SAGE fixes its own targets and the OR mask, so ``mask`` and
    ``targets`` accept only those.
    """

    name = "sage"
    trainer_class = SAGETrainer
    pseudo_labels = "global"
    default_mask = "or"

    def __init__(self, discrepancy_scale: float = DEFAULT_DISCREPANCY_SCALE, **kw: Any) -> None:
        if kw.get("mask") not in (None, "or") or kw.get("targets", "hard") != "hard":
            raise ConfigError(
                f"SAGE defines its own targets and the OR mask; got mask={kw.get('mask')!r}, "
                f"targets={kw.get('targets')!r}. Leave method.params.mask/targets unset"
            )
        discrepancy_scale = check_number(
            "discrepancy_scale",
            discrepancy_scale,
            0.0,
            hint=f"κ; the paper's code uses ln 2 / 0.05 = {DEFAULT_DISCREPANCY_SCALE:.4f}",
        )
        super().__init__(**kw)
        self.discrepancy_scale = discrepancy_scale

    def client_config(self, rnd: int) -> dict[str, ConfigValue]:
        return {**super().client_config(rnd), _CONFIG_KEY: self.discrepancy_scale}
