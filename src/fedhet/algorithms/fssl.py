"""Federated semi-supervised learning (FSSL): the pieces every FixMatch-style client and server shares.

Spec: methods.md §2.4, baselines.md §3.1-3.4. The client-side settings (``Instruction.config``, prefix
``fssl.``), the pseudo-targets and their mask, the masked KL of L_u, endless index streams, the batches of
labeled and unlabeled samples with their weak and strong views, the training normalisation, and the pooling
of the clients' pseudo-label statistics. The FixMatch local update that uses them (:class:`FixMatchTrainer`),
the FSSL server and the bounds are in ``fixmatch.py``; SAGE, ProxyFL and FedProto+FSSL build on both.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.algorithms.params import check_choice, check_flag, check_integer, check_number
from fedhet.devices import to_device
from fedhet.engine.protocol import ClientData, ConfigValue, Reply
from fedhet.errors import ConfigError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

__all__ = [
    "CODE_TRAIN_MEAN",
    "CODE_TRAIN_STD",
    "IndexStream",
    "PseudoTargets",
    "SemiSupervisedBatch",
    "SemiSupervisedSettings",
    "SemiSupervisedStep",
    "masked_kl_divergence",
    "pool_metrics",
    "pseudo_targets",
    "steps_per_epoch",
    "train_normalizer",
    "unlabeled_indices",
]

#: The reference normalises *training* images of every dataset with the CIFAR-10 mean and this std, while its
#: test set uses per-dataset statistics (methods.md §2.2, quirk ``normalization_mismatch``).
CODE_TRAIN_MEAN = (0.4914, 0.4822, 0.4465)
CODE_TRAIN_STD = (0.2471, 0.2435, 0.2616)
#: FixMatch's 1e-10 added to both distributions in the KL of L_u.
KL_EPSILON = 1e-10

PSEUDO_LABELERS = ("local", "global")
MASKS = ("or", "teacher", "all")
TARGETS = ("hard", "soft")


# --------------------------------------------------------------------------------------------------------
# Settings sent to the clients (Instruction.config, prefix "fssl.")
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SemiSupervisedSettings:
    """The client-side FixMatch settings (baselines.md §3.1: τ = 0.95, μ = 2, T = 1, λ_u = 1)."""

    pseudo_labels: str = "global"
    mask: str = "or"
    targets: str = "hard"
    threshold: float = 0.95
    unlabeled_ratio: int = 2
    temperature: float = 1.0
    unlabeled_weight: float = 1.0
    shared_optimizer: bool = False
    normalization_mismatch: bool = False
    flip: bool = True
    crop_padding: int = 4
    cutout: int = 16

    PREFIX = "fssl."

    def __post_init__(self) -> None:
        check_choice("pseudo_labels", self.pseudo_labels, PSEUDO_LABELERS)
        check_choice("mask", self.mask, MASKS)
        check_choice("targets", self.targets, TARGETS)
        check_number("threshold", self.threshold, 0.0, 1.0, hint="the paper uses 0.95")
        if isinstance(self.unlabeled_ratio, float):
            raise ConfigError(
                f"method.params.unlabeled_ratio={self.unlabeled_ratio!r} must be an integer >= 0"
            )
        check_integer(
            "unlabeled_ratio",
            self.unlabeled_ratio,
            0,
            hint="μ; the paper uses 2; 0 trains on the labeled batches only",
        )
        check_number("temperature", self.temperature, 0.0, low_open=True, hint="the paper uses 1")
        check_number("unlabeled_weight", self.unlabeled_weight, 0.0, hint="λ_u; the paper uses 1")
        for name in ("shared_optimizer", "normalization_mismatch", "flip"):
            check_flag(name, getattr(self, name))
        for name in ("crop_padding", "cutout"):
            if isinstance(getattr(self, name), float):
                raise ConfigError(f"method.params.{name}={getattr(self, name)!r} must be an integer >= 0")
            check_integer(name, getattr(self, name), 0, hint="pixels; the paper uses 4 and 16")

    def to_config(self) -> dict[str, ConfigValue]:
        """The settings as ``Instruction.config`` entries (``fssl.<name>``)."""
        return {self.PREFIX + f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SemiSupervisedSettings:
        """Read the settings back from an instruction's config (missing entries take the defaults)."""
        kwargs = {f.name: config[cls.PREFIX + f.name] for f in fields(cls) if cls.PREFIX + f.name in config}
        if "threshold" in kwargs:
            kwargs["threshold"] = float(kwargs["threshold"])
        return cls(**kwargs)

    @property
    def needs_global_model(self) -> bool:
        """Whether the client needs the frozen global model (GPL pseudo-labels or the OR mask)."""
        return self.pseudo_labels == "global" or self.mask == "or"


def steps_per_epoch(num_unlabeled: int, batch_size: int) -> int:
    """⌊|U_i|/B⌋ local steps per epoch (methods.md §2.4), at least 1 so tiny clients still train."""
    return max(1, num_unlabeled // batch_size)


# --------------------------------------------------------------------------------------------------------
# Pure functions: pseudo-targets and the masked KL
# --------------------------------------------------------------------------------------------------------
@dataclass
class PseudoTargets:
    """Targets t (U, C) for the strong views, the 0/1 mask (U,) and the hard pseudo-labels (U,)."""

    targets: Tensor
    mask: Tensor
    labels: Tensor


def pseudo_targets(
    local_probs: Tensor,
    global_probs: Tensor | None,
    *,
    pseudo_labels: str,
    mask: str,
    targets: str,
    threshold: float,
) -> PseudoTargets:
    """FixMatch pseudo-targets from the pseudo-labeler's probabilities (baselines.md §3.3/§3.4) with the
    mask of methods.md §2.4 step 6: ``"or"`` = [max p^L ≥ τ] ∨ [max p^G ≥ τ], ``"teacher"`` = the
    pseudo-labeler's own confidence, ``"all"`` = every sample (the "-ALL" variants)."""
    if pseudo_labels == "global" or mask == "or":
        if global_probs is None:
            raise ConfigError(f"pseudo_labels={pseudo_labels!r} with mask={mask!r} needs the global model")
    teacher = global_probs if pseudo_labels == "global" else local_probs
    confidence, labels = teacher.max(dim=1)
    if mask == "teacher":
        keep = confidence >= threshold
    elif mask == "or":
        keep = (local_probs.max(dim=1).values >= threshold) | (global_probs.max(dim=1).values >= threshold)
    elif mask == "all":
        keep = torch.ones_like(confidence, dtype=torch.bool)
    else:
        raise ConfigError(f"mask={mask!r}; accepted: {list(MASKS)}")
    if targets == "hard":
        target = F.one_hot(labels, teacher.shape[1]).to(teacher.dtype)
    elif targets == "soft":
        target = teacher
    else:
        raise ConfigError(f"targets={targets!r}; accepted: {list(TARGETS)}")
    return PseudoTargets(targets=target, mask=keep.to(teacher.dtype), labels=labels)


def masked_kl_divergence(targets: Tensor, logits: Tensor, mask: Tensor) -> Tensor:
    """L_u = (1/|U|) Σ_b m_b · KL(t_b + ε ‖ softmax(logits_b) + ε), ε = 1e-10 (methods.md §2.4 step 7,
    SAGE's ``F.kl_div`` form); for one-hot t this is the masked cross-entropy on the pseudo-label."""
    if targets.shape[0] == 0:
        return logits.sum() * 0.0
    q = torch.softmax(logits, dim=1) + KL_EPSILON
    t = targets + KL_EPSILON
    kl = (t * (t.log() - q.log())).sum(dim=1)
    return (kl * mask).mean()


# --------------------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------------------
class IndexStream:
    """An endless stream of ``indices`` in fresh random permutations (the client's generator)."""

    def __init__(self, indices: Tensor, generator: torch.Generator) -> None:
        self.indices = indices
        self.generator = generator
        self._order = indices[:0]
        self._position = 0

    def take(self, count: int) -> Tensor:
        """The next ``count`` indices, starting a new permutation whenever one is used up."""
        if count <= 0 or self.indices.numel() == 0:
            return self.indices[:0]
        parts, needed = [], count
        while needed > 0:
            if self._position >= self._order.numel():
                perm = torch.randperm(self.indices.numel(), generator=self.generator)
                self._order = self.indices[to_device(perm, self.indices.device)]
                self._position = 0
            chunk = self._order[self._position : self._position + needed]
            parts.append(chunk)
            self._position += chunk.numel()
            needed -= chunk.numel()
        return torch.cat(parts)


@dataclass
class SemiSupervisedBatch:
    """One local step's inputs (normalised model inputs) and labels; ``unlabeled_truth`` is for logging."""

    labeled: Tensor
    labels: Tensor
    weak: Tensor
    strong: Tensor
    unlabeled_truth: Tensor
    last_epoch: bool


@dataclass
class SemiSupervisedStep:
    """Everything one step computed, handed to the hooks ``extra_losses`` and ``observe``."""

    batch: SemiSupervisedBatch
    features: Tensor  # (B + 2U, D) backbone features of [x; u_w; u_s]
    logits: Tensor  # (B + 2U, C)
    num_labeled: int
    num_unlabeled: int
    local_probs: Tensor | None = None  # (U, C), detached, at temperature T
    global_probs: Tensor | None = None  # (U, C), frozen global model on u_w
    global_probs_labeled: Tensor | None = None  # (B, C), frozen global model on x (ProxyFL)
    pseudo: PseudoTargets | None = None
    losses: dict[str, float] = field(default_factory=dict)


def _code_normalizer(channels: int):
    if channels != 3:
        raise ConfigError(
            f"method.params.normalization_mismatch=true reproduces the reference's CIFAR-10 training "
            f"normalisation, which needs 3-channel images; these have {channels}. Set it to false"
        )
    mean = torch.tensor(CODE_TRAIN_MEAN).view(3, 1, 1)
    std = torch.tensor(CODE_TRAIN_STD).view(3, 1, 1)

    def normalize(x: Tensor) -> Tensor:
        return (x - mean.to(x.device, x.dtype)) / std.to(x.device, x.dtype)

    return normalize


def train_normalizer(data: ClientData, mismatch: bool):
    """The normalisation of training inputs: the data's own, or with ``mismatch`` the reference's CIFAR-10
    training statistics (quirk ``normalization_mismatch``, methods.md §2.2)."""
    if data.normalize is None:
        raise ConfigError(
            "semi-supervised trainers need raw [0, 1] inputs and a normalize function in ClientData; "
            "run them through the engine (it sets both when Trainer.needs_raw_inputs is True)"
        )
    if mismatch:
        if data.inputs.dim() == 2:
            raise ConfigError(
                "method.params.normalization_mismatch=true reproduces a CIFAR-10 quirk; a table has no such "
                "statistics. Set it to false"
            )
        return _code_normalizer(int(data.inputs.shape[1]))
    return data.normalize


def unlabeled_indices(data: ClientData) -> Tensor:
    """U_i: the split's unlabeled set (with the labeled copies); the labeled set when there is none."""
    return data.unlabeled_indices if data.unlabeled_indices is not None else data.indices


# --------------------------------------------------------------------------------------------------------
# The server: the clients' pseudo-label statistics, pooled
# --------------------------------------------------------------------------------------------------------
def pool_metrics(replies: Mapping[int, Reply]) -> dict[str, Any]:
    """Pseudo-label accuracy (all / used), the used fraction and mean losses, pooled over the clients."""
    sums: dict[str, float] = defaultdict(float)
    losses: dict[str, list[float]] = defaultdict(list)
    for cid in sorted(replies):
        for key, value in replies[cid].metrics.items():
            if key.startswith("pseudo_"):
                sums[key] += float(value)
            elif key.startswith("loss_") and math.isfinite(value):
                losses[key].append(float(value))
    record: dict[str, Any] = {}
    total, used = sums.get("pseudo_total", 0.0), sums.get("pseudo_used", 0.0)
    if total > 0:
        record["pseudo_label_accuracy"] = sums["pseudo_correct"] / total
        record["unlabeled_used_fraction"] = used / total
        if used > 0:
            record["pseudo_label_accuracy_used"] = sums["pseudo_used_correct"] / used
    for key, values in losses.items():
        record[key] = float(np.mean(values))
    return record
