"""FedSAC (Wang et al., KDD'24), a re-implementation: the official repository holds only a README.

Reconstructed from the paper's abstract and the structure FedRAC inherits (baselines.md §2.6): neurons are
ordered by their importance on the server validation set, clients get nested submodels of the most
important neurons whose validation accuracy stays at or below a contribution-dependent target with a
fixed ratio, and each parameter is averaged over the clients that trained it. It shares all submodel
machinery with FedRAC through :class:`~fedhet.algorithms.submodel.SubmodelStrategy`; only the unit order
(importance instead of frequency) and the threshold ratio (fixed instead of scheduled) differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.algorithms.allocation import validation_subset
from fedhet.algorithms.params import check_integer, check_number
from fedhet.algorithms.submodel import SubmodelStrategy
from fedhet.engine.protocol import FederationInfo

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

#: Elements of the (B, units, H) leave-one-out activations one chunk of the mlp200 path may hold (16 MB).
_CHUNK_ELEMENTS = 1 << 22


@torch.no_grad()
def _mlp_importance(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Exact leave-one-out loss increase of every mlp200 unit, by rank-one corrections of one forward pass.

    Removing layer-2 unit v subtracts h2_v·W_head[:, v] from the logits; removing layer-1 unit u subtracts
    h1_u·W2[:, u] from the layer-2 pre-activation, which then goes through ReLU and the head again.
    """
    h1 = torch.relu(model.fc1(x.flatten(1)))
    pre2 = model.fc2(h1)
    h2 = torch.relu(pre2)
    logits = model.head(h2)
    base = F.cross_entropy(logits, y)
    head_t = model.head.weight.t()  # (H, C)
    batch, width = h1.shape

    def loss_per_unit(unit_logits: Tensor) -> Tensor:  # (B, U, C) -> (U,)
        logp = torch.log_softmax(unit_logits, dim=-1)
        picked = logp.gather(2, y[:, None, None].expand(-1, unit_logits.shape[1], 1))
        return -picked.squeeze(2).mean(0)

    second = loss_per_unit(logits[:, None, :] - h2[:, :, None] * head_t[None])
    chunk = max(1, _CHUNK_ELEMENTS // max(1, batch * width))
    w2_t = model.fc2.weight.t()  # (H_in, H_out)
    parts = []
    for start in range(0, width, chunk):
        units = slice(start, min(width, start + chunk))
        pre = pre2[:, None, :] - h1[:, units, None] * w2_t[None, units, :]
        parts.append(loss_per_unit(torch.relu(pre) @ model.head.weight.t() + model.head.bias))
    first = torch.cat(parts)
    return torch.cat([first, second]) - base


@torch.no_grad()
def unit_importance(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 256) -> Tensor:
    """Importance of each maskable unit: validation loss without it minus with the full model (FedSAC).

    mlp200 takes an exact closed-form path; other models evaluate the K leave-one-out masks with
    ``masked_logits`` (K passes over (x, y)). Runs in eval mode; returns a (K,) float tensor on the CPU.
    """
    from fedhet.models import masked_logits
    from fedhet.models.mlp import MaskedMLP

    was_training = model.training
    model.eval()
    try:
        if isinstance(model, MaskedMLP):
            return _mlp_importance(model, x, y).cpu()
        units = model.maskable_units
        base = F.cross_entropy(model(x), y, reduction="sum")
        total = torch.zeros(units, dtype=torch.float64)
        for first in range(0, units, 64):
            count = min(64, units - first)
            masks = torch.ones(count, units, device=x.device)
            masks[torch.arange(count), torch.arange(first, first + count)] = 0
            for start in range(0, len(x), batch_size):
                logits = masked_logits(model, x[start : start + batch_size], masks)
                target = y[start : start + batch_size].repeat(count)
                loss = F.cross_entropy(logits.flatten(0, 1), target, reduction="none")
                total[first : first + count] += loss.view(count, -1).sum(1).double().cpu()
        return ((total - float(base)) / len(y)).float()
    finally:
        model.train(was_training)


class FedSAC(SubmodelStrategy):
    """FedSAC (KDD'24), re-implementation: importance-ordered nested submodels with a fixed ratio.

    Each round the units are ranked by their validation importance (loss increase when masked out, on a
    fixed seeded subset of ``importance_samples`` validation samples, recomputed every
    ``importance_every`` rounds), client i gets the largest prefix of that ranking whose validation
    accuracy ≤ c_i + (1 − ``fixed_ratio``)·Acc_g·c_i^n/100, the top contributor the full model; parameters
    are averaged over the clients that trained them. β and the step follow FedRAC's per-model defaults.
    [ours] fixed_ratio 0.4 (the ratio of FedRAC's fixed-ratio ablation), importance on 1,000 validation
    samples every 5 rounds (≈ 0.45 s per evaluation for mlp200 on one CPU thread).
    """

    name = "fedsac"
    label = "FedSAC (re-implementation)"

    def __init__(
        self,
        sharpness: float | None = None,
        fixed_ratio: float = 0.4,
        candidate_step: int | None = None,
        importance_samples: int | None = 1000,
        importance_every: int = 5,
        validation_samples: int | None = None,
    ) -> None:
        super().__init__(
            sharpness=sharpness,
            candidate_step=candidate_step,
            candidate_step_late=candidate_step,
            switch_round=None,
            validation_samples=validation_samples,
        )
        check_number("fixed_ratio", fixed_ratio, 0.0, 1.0)
        if importance_samples is not None:
            check_integer("importance_samples", importance_samples, 1)
        check_integer("importance_every", importance_every, 1)
        self.fixed_ratio = float(fixed_ratio)
        self.importance_samples = importance_samples
        self.importance_every = int(importance_every)
        self.importance: Tensor | None = None
        self.importance_round = 0

    def setup(self, info: FederationInfo) -> None:
        """The shared set-up plus the fixed validation subset for the importance evaluation."""
        super().setup(info)
        self.importance_x, self.importance_y = validation_subset(
            info.validation, self.importance_samples, info.rng
        )

    def candidate_step(self, rnd: int) -> int:
        """One step for the whole run (FedSAC has no phase switch)."""
        return self.steps[0]

    def threshold_ratio(self, rnd: int) -> float:
        return self.fixed_ratio

    def unit_order(self, rnd: int) -> Tensor:
        """Units by descending importance (ties by index), recomputed every ``importance_every`` rounds."""
        if self.importance is None or rnd - self.importance_round >= self.importance_every:
            self.importance = unit_importance(self.model, self.importance_x, self.importance_y)
            self.importance_round = rnd
        return torch.argsort(-self.importance, stable=True)

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        out = super().round_metrics(rnd)
        if self.importance is not None and self.importance_round == rnd:
            out["importance_mean"] = float(self.importance.mean())
        return out

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        if self.importance is not None:
            sd["importance"] = self.importance.clone()
        sd["importance_round"] = self.importance_round
        return sd

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        super().load_state_dict(sd)
        self.importance = sd["importance"].clone() if "importance" in sd else None
        self.importance_round = int(sd.get("importance_round", 0))
