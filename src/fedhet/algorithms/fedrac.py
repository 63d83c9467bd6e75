"""FedRAC (CVPR 2026): collaborative fairness by dynamic reputation and rolling submodel allocation.

methods.md §3, baselines.md §1.2-1.3, §2.7. FedRAC orders the units least-used first (the frequency table,
its "rolling" allocation) and takes λ·(1 − 1/ln(ζt + κ)) of the global accuracy off each client's reputation
threshold (its "dynamic reputation"); the paper's two ablations drop one each. The shared submodel machinery
is in ``submodel.py`` (the strategy) and ``allocation.py`` (contributions, candidates, allocation, masked
averaging, batched evaluation).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.algorithms.params import check_number
from fedhet.algorithms.submodel import SubmodelStrategy
from fedhet.models.masks import random_mask

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1


def dynamic_ratio(rnd: int, ratio: float, time_scale: float = 0.3, time_offset: float = 3.0) -> float:
    """FedRAC's schedule λ·(1 − 1/ln(ζ·t + κ)) of the share of Acc_g taken off the threshold (§3.4 step 4)."""
    return ratio * (1.0 - 1.0 / math.log(time_scale * rnd + time_offset))


class FedRAC(SubmodelStrategy):
    """FedRAC (CVPR'26): dynamic reputation λ·(1−1/ln(ζt+κ)) and rolling (least-used-first) submodels.

    Defaults per model (methods §3.4): mlp200 β=80, λ 0.2 → 0.8 after round 100, step 8; resnet18gn β=10,
    λ=0.95, step 32 → 8 after round 200. ``mask_off_by_one`` reproduces the code's mask-size quirk.
    Data-free [ours, docs/data-free-fairness.md]: ``contributions = "celm"`` (no standalone pre-pass) and
    ``candidate_score = "probe"`` (no validation set); see :class:`SubmodelStrategy`.
    """

    name = "fedrac"
    label = "FedRAC"

    def __init__(
        self,
        reputation_ratio: float | None = None,
        reputation_ratio_late: float | None = None,
        time_scale: float = 0.3,
        time_offset: float = 3.0,
        **options: Any,
    ) -> None:
        """λ (``reputation_ratio``, ``_late``), ζ, κ; the shared options go to :class:`SubmodelStrategy`."""
        super().__init__(**options)
        for key, value in (
            ("reputation_ratio", reputation_ratio),
            ("reputation_ratio_late", reputation_ratio_late),
        ):
            if value is not None:
                check_number(key, value, 0.0, 1.0)
        check_number("time_scale", time_scale, 1e-12)
        # ln(ζ·t + κ) must stay above 0 from t = 2 on, or the schedule's 1/ln blows up.
        check_number("time_offset", time_offset, 1.0 + 1e-9)
        self._requested["reputation_ratio"] = reputation_ratio
        self._requested["reputation_ratio_late"] = reputation_ratio_late
        self.time_scale = float(time_scale)
        self.time_offset = float(time_offset)

    def threshold_ratio(self, rnd: int) -> float:
        """λ_t·(1 − 1/ln(ζ·t + κ)), λ_t = ``reputation_ratio`` up to ``switch_round``, then ``_late``."""
        key = "reputation_ratio" if rnd <= self.switch_round else "reputation_ratio_late"
        return dynamic_ratio(rnd, float(self.resolve(key)), self.time_scale, self.time_offset)


class FedRACFixedRatio(SubmodelStrategy):
    """FedRAC without dynamic reputation (paper's ablation): tmp = ``fixed_ratio``·Acc_g every round.

    ``fixed_ratio`` = 0.4 [ours]: the code's declared but unused ``alpha`` (its commented-out ``al = alpha``).
    """

    name = "fedrac-fixed-ratio"
    label = "FedRAC w/o dynamic reputation"

    def __init__(self, fixed_ratio: float = 0.4, **options: Any) -> None:
        super().__init__(**options)
        check_number("fixed_ratio", fixed_ratio, 0.0, 1.0)
        self.fixed_ratio = float(fixed_ratio)

    def threshold_ratio(self, rnd: int) -> float:
        return self.fixed_ratio


class FedRACRandomMasks(FedRAC):
    """FedRAC without rolling allocation (paper's ablation): random submodels of the allocated sizes.

    [ours] Candidates are prefixes of a fresh random unit order each round (sizes still follow the
    thresholds); each non-top client then gets an independent uniformly random mask of its size.
    """

    name = "fedrac-random-masks"
    label = "FedRAC w/o rolling allocation"

    def _round_generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(int(self.info.rng.integers(0, 2**63 - 1)))

    def unit_order(self, rnd: int) -> Tensor:
        return torch.randperm(self.units, generator=self._round_generator())

    def build_masks(self, order: Tensor, sizes: np.ndarray, rnd: int) -> Tensor:
        generator = self._round_generator()
        return torch.stack([random_mask(self.units, int(s), generator) for s in sizes])


class FedRACStrictSizes(FedRAC):
    """FedRAC with strictly increasing submodel sizes [ours]: each client's scan leaves one candidate per
    later client, so no two clients tie (the code lets them tie at the largest proper submodel). Reported
    beside FedRAC in the reproductions: the staircase puts the rank order into the rewards."""

    name = "fedrac-strict"
    label = "FedRAC (strict sizes)"

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("strict_sizes", True)
        super().__init__(**kwargs)


class FedRACDataFree(FedRAC):
    """Data-free FedRAC [ours, docs/data-free-fairness.md]: reputations from CELM's evidence during the first
    rounds (``contributions = "celm"``, no standalone pre-pass) and candidates scored on inputs grown from
    the global model (``candidate_score = "probe"``, no validation set). Either can be set back."""

    name = "fedrac-data-free"
    label = "FedRAC (data-free)"

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("contributions", "celm")
        kwargs.setdefault("candidate_score", "probe")
        super().__init__(**kwargs)
