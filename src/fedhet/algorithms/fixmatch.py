"""Federated semi-supervised learning (FSSL): the FixMatch client update shared by FixMatch-LPL/GPL, SAGE,
ProxyFL and FedProto+FSSL, and FedAvg on the labeled samples only and on fully labeled data (the bounds).

Spec: methods.md §2.4 (ProxyFL's ``Local.fixmatch_train``), baselines.md §3.1-3.4. One local step:

1. a labeled batch x (B = ``train.batch_size``, weak view: flip + 4-px reflect crop) and an unlabeled batch
   of μ·B images with a weak view u_w and a strong view u_s (weak + RandAugment(2, 10) + Cutout 16);
2. one forward pass of the local model on the concatenation [x; u_w; u_s], so BatchNorm normalises the
   three parts together (FixMatch's interleave only matters when the batch is split over several GPUs:
   on one device the batch statistics of the concatenation are the same, so we do not interleave);
3. L_s = CE(logits_x, y);
4. pseudo-labels on u_w from the local model (LPL, its own logits of step 2, detached) or from a frozen copy
   of the round's global model in eval mode (GPL), p = softmax(logits / T);
5. mask: the pseudo-labeler's own confidence (``mask="teacher"``, FixMatch), the OR of the local and the
   global confidence (``mask="or"``, methods.md §2.4 step 6: m = [max p^L ≥ τ] ∨ [max p^G ≥ τ]), or all;
6. L_u = mean over the unlabeled batch of m · KL(t ‖ softmax(logits_{u_s})) with t the one-hot argmax
   (``targets="hard"``) or the pseudo-labeler's probabilities (``"soft"``), both with 1e-10 added;
7. loss = L_s + λ_u·L_u (+ the method's extra terms: ICPL, FedProto, proximal).

An epoch is ⌊|U_i|/B⌋ steps, U_i the client's unlabeled set including the copies of its labeled samples;
``train.local_steps`` replaces ``local_epochs`` epochs when set. Labeled and unlabeled batches are drawn from
endless streams of fresh permutations (a client with fewer than B labeled samples repeats them in a batch,
as the reference's 2000-fold repeated labeled list does). Statistics for logging (pseudo-label accuracy
against the true labels of the unlabeled samples, which are used for nothing else, and the fraction of
unlabeled samples that pass the mask) are taken over the last epoch's steps, as the reference does.
"""

from __future__ import annotations

import copy
import csv
import math
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.algorithms.fedavg import FedAvg
from fedhet.data.augment import Augmenter
from fedhet.engine.protocol import (
    ClientData,
    ClientState,
    ConfigValue,
    Instruction,
    Reply,
    TrainContext,
    Trainer,
    Weights,
    clone_weights,
)
from fedhet.errors import ConfigError

__all__ = [
    "CODE_TRAIN_MEAN",
    "CODE_TRAIN_STD",
    "LABELED_REPEAT",
    "SERVER_TENSOR_PREFIX",
    "FixMatchGPL",
    "FixMatchLPL",
    "FixMatchTrainer",
    "FullySupervised",
    "FullySupervisedTrainer",
    "IndexStream",
    "PseudoTargets",
    "SemiSupervised",
    "SemiSupervisedBatch",
    "SemiSupervisedSettings",
    "SemiSupervisedStep",
    "is_finite_number",
    "masked_kl_divergence",
    "plot_round_series",
    "pseudo_targets",
    "split_server_tensors",
    "steps_per_epoch",
]

#: The reference's labeled dataset wrapper repeats its index list 2000 times and reports that length, so its
#: FedAvg weights are 2000·|L_i| + |U_i| (methods.md §2.6 step 1, quirk ``inflated_labeled_weights``).
LABELED_REPEAT = 2000
#: Instruction.weights entries under this prefix are extra server tensors (ProxyFL's prior, FedProto's
#: prototypes), not model parameters; FSSL trainers split them off before loading the model.
SERVER_TENSOR_PREFIX = "server."
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
def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


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
        p = "method.params."
        _check(
            self.pseudo_labels in PSEUDO_LABELERS,
            f"pseudo_labels={self.pseudo_labels!r}; accepted: {list(PSEUDO_LABELERS)}",
        )
        _check(self.mask in MASKS, f"{p}mask={self.mask!r}; accepted: {list(MASKS)}")
        _check(self.targets in TARGETS, f"{p}targets={self.targets!r}; accepted: {list(TARGETS)}")
        _check(
            is_finite_number(self.threshold) and 0.0 <= self.threshold <= 1.0,
            f"{p}threshold={self.threshold!r} must be a number in [0, 1] (the paper uses 0.95)",
        )
        _check(
            isinstance(self.unlabeled_ratio, int)
            and not isinstance(self.unlabeled_ratio, bool)
            and self.unlabeled_ratio >= 0,
            f"{p}unlabeled_ratio={self.unlabeled_ratio!r} must be an integer >= 0 (μ; the paper uses 2; "
            "0 trains on the labeled batches only)",
        )
        _check(
            is_finite_number(self.temperature) and self.temperature > 0,
            f"{p}temperature={self.temperature!r} must be a number > 0 (the paper uses 1)",
        )
        _check(
            is_finite_number(self.unlabeled_weight) and self.unlabeled_weight >= 0,
            f"{p}unlabeled_weight={self.unlabeled_weight!r} must be a number >= 0 (λ_u; the paper uses 1)",
        )
        for name in ("shared_optimizer", "normalization_mismatch", "flip"):
            value = getattr(self, name)
            _check(isinstance(value, bool), f"{p}{name}={value!r} must be true or false")
        for name in ("crop_padding", "cutout"):
            value = getattr(self, name)
            _check(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                f"{p}{name}={value!r} must be an integer >= 0 (pixels; the paper uses 4 and 16)",
            )

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


def is_finite_number(value: Any) -> bool:
    """True for a finite int or float that is not a bool (config validation)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def split_server_tensors(weights: Mapping[str, Tensor]) -> tuple[Weights, dict[str, Tensor]]:
    """Split ``Instruction.weights`` into model weights and the extra server tensors (prefix ``server.``)."""
    model, extra = {}, {}
    for key, value in weights.items():
        if key.startswith(SERVER_TENSOR_PREFIX):
            extra[key[len(SERVER_TENSOR_PREFIX) :]] = value
        else:
            model[key] = value
    return model, extra


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
                self._order = self.indices[perm.to(self.indices.device)]
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


def _train_normalizer(data: ClientData, mismatch: bool):
    if data.normalize is None:
        raise ConfigError(
            "semi-supervised trainers need raw [0, 1] inputs and a normalize function in ClientData; "
            "run them through the engine (it sets both when Trainer.needs_raw_inputs is True)"
        )
    if mismatch:
        return _code_normalizer(int(data.inputs.shape[1]))
    return data.normalize


# --------------------------------------------------------------------------------------------------------
# The client: FixMatch local update
# --------------------------------------------------------------------------------------------------------
class FixMatchTrainer(Trainer):
    """FixMatch local update on labeled + unlabeled batches (methods.md §2.4 steps 1-7, baselines.md §3.3).

    Hooks for methods built on it: :meth:`make_pseudo_targets` (SAGE), :meth:`extra_losses` (ICPL, FedProto),
    :meth:`observe` (per-step bookkeeping, e.g. class counts), :meth:`payload` (extra reply tensors).
    """

    needs_raw_inputs = True
    #: Whether the frozen global model must also predict the labeled batch (ProxyFL's ICPL uses p_x^G).
    needs_global_on_labeled = False

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.weak = Augmenter("weak")
        self.strong = Augmenter("strong")
        self.settings = SemiSupervisedSettings()
        self.server_tensors: dict[str, Tensor] = {}
        self._teacher: nn.Module | None = None
        self._shared_optimizer_state: dict[str, Any] | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._normalize = None
        self._stats: dict[str, float] = defaultdict(float)

    # -- set-up --------------------------------------------------------------------------------------------
    def start_weights(self, ins: Instruction, state: ClientState, ctx: TrainContext) -> Weights:
        """The global weights, after splitting off the server's extra tensors (``server.*``)."""
        model_weights, self.server_tensors = split_server_tensors(ins.weights)
        return super().start_weights(replace(ins, weights=model_weights), state, ctx)

    def prepare(
        self, model: nn.Module, data: ClientData, ins: Instruction, state: ClientState, ctx: TrainContext
    ) -> None:
        """Read the settings, freeze a copy of the round's global model (GPL / OR mask), reset the stats."""
        self.settings = SemiSupervisedSettings.from_config(ins.config)
        self._normalize = _train_normalizer(data, self.settings.normalization_mismatch)
        s = self.settings
        self.weak = Augmenter("weak", pad=s.crop_padding, flip=s.flip)
        self.strong = Augmenter("strong", pad=s.crop_padding, flip=s.flip, cutout=s.cutout)
        self._stats = defaultdict(float)
        if self.settings.needs_global_model and self.settings.unlabeled_ratio > 0:
            if self._teacher is None:
                self._teacher = copy.deepcopy(model)
            self._teacher.load_state_dict(model.state_dict())
            self._teacher.eval()
            self._teacher.requires_grad_(False)

    def make_optimizer(self, model: nn.Module, ins: Instruction, ctx: TrainContext) -> torch.optim.Optimizer:
        """The configured optimizer; with ``shared_optimizer`` it resumes the previous client's momentum
        buffers (the reference creates one SGD object for all clients and rounds, methods.md §2.4)."""
        optimizer = super().make_optimizer(model, ins, ctx)
        if self.settings.shared_optimizer and self._shared_optimizer_state is not None:
            lr = optimizer.param_groups[0]["lr"]
            optimizer.load_state_dict(self._shared_optimizer_state)
            for group in optimizer.param_groups:
                group["lr"] = lr
        self._optimizer = optimizer
        return optimizer

    # -- data ----------------------------------------------------------------------------------------------
    @staticmethod
    def unlabeled_indices(data: ClientData) -> Tensor:
        """U_i: the split's unlabeled set (with the labeled copies); the labeled set when there is none."""
        return data.unlabeled_indices if data.unlabeled_indices is not None else data.indices

    def num_steps(self, data: ClientData, ctx: TrainContext) -> int:
        """``train.local_steps`` if set, else ``local_epochs`` · ⌊|U_i|/B⌋ (methods.md §2.4)."""
        if ctx.train.local_steps:
            return int(ctx.train.local_steps)
        per_epoch = steps_per_epoch(int(self.unlabeled_indices(data).numel()), ctx.train.batch_size)
        return max(1, int(round(ctx.train.local_epochs * per_epoch)))

    def batches(self, data: ClientData, ctx: TrainContext) -> Iterator[SemiSupervisedBatch]:
        """Labeled batches of B and unlabeled batches of μ·B (weak + strong views), augmented, normalised."""
        gen = ctx.generator
        batch_size = ctx.train.batch_size
        unlabeled_size = self.settings.unlabeled_ratio * batch_size
        unlabeled = self.unlabeled_indices(data)
        labeled_stream = IndexStream(data.indices, gen)
        unlabeled_stream = IndexStream(unlabeled, gen)
        steps = self.num_steps(data, ctx)
        last_epoch_start = steps - steps_per_epoch(int(unlabeled.numel()), batch_size)
        norm = self._normalize
        for step in range(steps):
            li = labeled_stream.take(batch_size)
            ui = unlabeled_stream.take(unlabeled_size)
            raw_x = data.inputs[li]
            x = norm(self.weak(raw_x, gen)) if li.numel() else norm(raw_x)
            raw_u = data.inputs[ui]
            if ui.numel():
                weak, strong = norm(self.weak(raw_u, gen)), norm(self.strong(raw_u, gen))
            else:
                weak = strong = norm(raw_u)
            yield SemiSupervisedBatch(
                labeled=x,
                labels=data.labels[li],
                weak=weak,
                strong=strong,
                unlabeled_truth=data.labels[ui],
                last_epoch=step >= last_epoch_start,
            )

    # -- the loss ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def global_predictions(self, batch: SemiSupervisedBatch) -> tuple[Tensor, Tensor | None]:
        """softmax(G(u_w)/T) and, for ProxyFL, softmax(G(x)/T) from the frozen global model (eval mode)."""
        temperature = self.settings.temperature
        num_labeled = batch.labeled.shape[0] if self.needs_global_on_labeled else 0
        inputs = torch.cat([batch.labeled, batch.weak]) if num_labeled else batch.weak
        probs = torch.softmax(self._teacher(inputs) / temperature, dim=1)
        return probs[num_labeled:], (probs[:num_labeled] if num_labeled else None)

    def make_pseudo_targets(self, step: SemiSupervisedStep) -> PseudoTargets:
        """Pseudo-targets and mask for the strong views (override for SAGE's corrected targets)."""
        s = self.settings
        return pseudo_targets(
            step.local_probs,
            step.global_probs,
            pseudo_labels=s.pseudo_labels,
            mask=s.mask,
            targets=s.targets,
            threshold=s.threshold,
        )

    def extra_losses(self, model: nn.Module, step: SemiSupervisedStep, ins: Instruction) -> dict[str, Tensor]:
        """Extra weighted loss terms by name (ProxyFL's ICPL, FedProto's prototype term); none here."""
        return {}

    def loss(
        self, model: nn.Module, batch: SemiSupervisedBatch, ins: Instruction, state: ClientState
    ) -> Tensor:
        """L_s + λ_u·L_u + extra terms for one step, from one forward pass of [x; u_w; u_s]."""
        s = self.settings
        nb, nu = batch.labeled.shape[0], batch.weak.shape[0]
        inputs = torch.cat([batch.labeled, batch.weak, batch.strong])
        features = model.features(inputs)
        logits = model.head(features)
        step = SemiSupervisedStep(batch, features, logits, nb, nu)
        total = F.cross_entropy(logits[:nb], batch.labels) if nb else logits.sum() * 0.0
        step.losses["loss_supervised"] = float(total.detach())
        if nu:
            step.local_probs = torch.softmax(logits[nb : nb + nu].detach() / s.temperature, dim=1)
            if self._teacher is not None and s.needs_global_model:
                step.global_probs, step.global_probs_labeled = self.global_predictions(batch)
            step.pseudo = self.make_pseudo_targets(step)
            loss_u = masked_kl_divergence(step.pseudo.targets, logits[nb + nu :], step.pseudo.mask)
            step.losses["loss_unlabeled"] = float(loss_u.detach())
            total = total + s.unlabeled_weight * loss_u
        for name, term in self.extra_losses(model, step, ins).items():
            step.losses[name] = float(term.detach())
            total = total + term
        self.observe(step)
        return total

    def observe(self, step: SemiSupervisedStep) -> None:
        """Accumulate loss means and, in the last epoch, the pseudo-label statistics (methods.md §2.7)."""
        stats = self._stats
        stats["steps"] += 1
        for name, value in step.losses.items():
            stats[name] += value
        if step.pseudo is None or not step.batch.last_epoch:
            return
        correct = step.pseudo.labels == step.batch.unlabeled_truth
        used = step.pseudo.mask > 0
        stats["pseudo_total"] += float(step.num_unlabeled)
        stats["pseudo_correct"] += float(correct.sum())
        stats["pseudo_used"] += float(used.sum())
        stats["pseudo_used_correct"] += float((correct & used).sum())

    # -- the reply -----------------------------------------------------------------------------------------
    def payload(self, data: ClientData) -> dict[str, Tensor]:
        """Extra tensors for the server (ProxyFL's class counts, FedProto's prototypes); none here."""
        return {}

    def finish(
        self,
        model: nn.Module,
        data: ClientData,
        ins: Instruction,
        state: ClientState,
        ctx: TrainContext,
        metrics: dict[str, float],
    ) -> Reply:
        """Weights, n_i = |L_i| + |U_i| (baselines.md §3.1), loss means, pseudo-label counts, payload."""
        if self.settings.shared_optimizer and self._optimizer is not None:
            self._shared_optimizer_state = copy.deepcopy(self._optimizer.state_dict())
        stats = dict(self._stats)
        steps = max(stats.pop("steps", 0.0), 1.0)
        for key in list(stats):
            if key.startswith("loss_"):
                metrics[key] = stats.pop(key) / steps
        metrics.update(stats)
        num_labeled = data.num_examples
        metrics["num_labeled"] = float(num_labeled)
        num_unlabeled = int(self.unlabeled_indices(data).numel()) if data.unlabeled_indices is not None else 0
        return Reply(
            weights=clone_weights(model.state_dict()),
            num_examples=num_labeled + num_unlabeled,
            metrics=metrics,
            payload=self.payload(data),
        )


# --------------------------------------------------------------------------------------------------------
# The server: FedAvg plus per-round pseudo-label bookkeeping
# --------------------------------------------------------------------------------------------------------
#: Per-round numbers every FSSL strategy logs (metrics.jsonl, fssl_rounds.csv).
ROUND_KEYS = ("pseudo_label_accuracy", "pseudo_label_accuracy_used", "unlabeled_used_fraction")


class SemiSupervised(FedAvg):
    """FedAvg of FixMatch-trained clients (baselines.md §3.1); the base of LPL, GPL, SAGE, ProxyFL, FedProto.

    Parameters (paper defaults): ``threshold`` τ = 0.95, ``unlabeled_ratio`` μ = 2, ``temperature`` T = 1,
    ``unlabeled_weight`` λ_u = 1, ``mask`` (None = the method's own), ``targets`` "hard" | "soft". Code
    quirks, off by default: ``shared_optimizer``, ``inflated_labeled_weights`` (n_i = 2000·|L_i| + |U_i|),
    ``normalization_mismatch`` (CIFAR-10 training normalisation, methods.md §2.2). Augmentation: ``flip``
    (true; the reference flips SVHN too), ``crop_padding`` 4 px, ``cutout`` 16 px at 32x32 (scaled with size).
    """

    name = "fssl"
    trainer_class: type[Trainer] = FixMatchTrainer
    #: Where pseudo-labels come from: the local model ("local", LPL) or the frozen global model ("global").
    pseudo_labels = "global"
    #: The mask when ``mask`` is not given.
    default_mask = "or"

    def __init__(
        self,
        threshold: float = 0.95,
        unlabeled_ratio: int = 2,
        temperature: float = 1.0,
        unlabeled_weight: float = 1.0,
        mask: str | None = None,
        targets: str = "hard",
        shared_optimizer: bool = False,
        inflated_labeled_weights: bool = False,
        normalization_mismatch: bool = False,
        flip: bool = True,
        crop_padding: int = 4,
        cutout: int = 16,
        weighting: str = "samples",
        reward: str = "none",
    ) -> None:
        super().__init__(weighting=weighting, reward=reward)
        self.settings = SemiSupervisedSettings(
            pseudo_labels=self.pseudo_labels,
            mask=self.default_mask if mask is None else mask,
            targets=targets,
            threshold=float(threshold) if is_finite_number(threshold) else threshold,
            unlabeled_ratio=unlabeled_ratio,
            temperature=temperature,
            unlabeled_weight=unlabeled_weight,
            shared_optimizer=shared_optimizer,
            normalization_mismatch=normalization_mismatch,
            flip=flip,
            crop_padding=crop_padding,
            cutout=cutout,
        )
        _check(
            isinstance(inflated_labeled_weights, bool),
            f"method.params.inflated_labeled_weights={inflated_labeled_weights!r} must be true or false",
        )
        self.inflated_labeled_weights = inflated_labeled_weights
        #: One dict per round: pooled pseudo-label statistics and mean losses of the replies.
        self.history: list[dict[str, Any]] = []

    # -- hooks ---------------------------------------------------------------------------------------------
    def client_config(self, rnd: int) -> dict[str, ConfigValue]:
        """Config entries every client receives this round (subclasses add theirs)."""
        return self.settings.to_config()

    def server_tensors(self, rnd: int) -> dict[str, Tensor]:
        """Extra tensors sent inside ``Instruction.weights`` under ``server.`` (subclasses add theirs)."""
        return {}

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """The global model, the FixMatch settings and the method's extra server tensors for every client."""
        weights = dict(self.global_weights())
        for key, value in self.server_tensors(rnd).items():
            weights[SERVER_TENSOR_PREFIX + key] = value
        config = self.client_config(rnd)
        return {cid: Instruction(weights=weights, config=dict(config)) for cid in client_ids}

    def aggregation_weights(self, rnd: int, replies: dict[int, Reply]) -> np.ndarray:
        """n_i = |L_i| + |U_i|; with ``inflated_labeled_weights`` the reference's 2000·|L_i| + |U_i|."""
        weights = super().aggregation_weights(rnd, replies)
        if self.inflated_labeled_weights and self.weighting == "samples":
            labeled = np.array([replies[c].metrics.get("num_labeled", 0.0) for c in sorted(replies)])
            weights = weights + (LABELED_REPEAT - 1) * labeled
        return weights

    def aggregate(self, rnd: int, replies: dict[int, Reply]) -> None:
        """FedAvg, then pool the clients' pseudo-label counts and mean losses into this round's record."""
        super().aggregate(rnd, replies)
        self.history.append(self.pool_metrics(rnd, replies))

    @staticmethod
    def pool_metrics(rnd: int, replies: dict[int, Reply]) -> dict[str, Any]:
        """Pseudo-label accuracy (all / used) and the used fraction, pooled over the clients."""
        sums: dict[str, float] = defaultdict(float)
        losses: dict[str, list[float]] = defaultdict(list)
        for cid in sorted(replies):
            for key, value in replies[cid].metrics.items():
                if key.startswith("pseudo_"):
                    sums[key] += float(value)
                elif key.startswith("loss_") and math.isfinite(value):
                    losses[key].append(float(value))
        record: dict[str, Any] = {"round": rnd}
        total, used = sums.get("pseudo_total", 0.0), sums.get("pseudo_used", 0.0)
        if total > 0:
            record["pseudo_label_accuracy"] = sums["pseudo_correct"] / total
            record["unlabeled_used_fraction"] = used / total
            if used > 0:
                record["pseudo_label_accuracy_used"] = sums["pseudo_used_correct"] / used
        for key, values in losses.items():
            record[key] = float(np.mean(values))
        return record

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        """This round's pseudo-label numbers and mean losses (into metrics.jsonl)."""
        out = super().round_metrics(rnd)
        if self.history and self.history[-1]["round"] == rnd:
            out.update({k: v for k, v in self.history[-1].items() if k != "round"})
        return out

    # -- artifacts ------------------------------------------------------------------------------------------
    def write_artifacts(self, run_dir: Any) -> None:
        """``fssl_rounds.csv`` and ``figures/pseudo_labels.png`` (pseudo-label accuracy, used fraction)."""
        if not self.history:
            return
        run_dir = Path(run_dir)
        keys = sorted(
            {k for h in self.history for k, v in h.items() if k != "round" and isinstance(v, int | float)}
        )
        with open(run_dir / "fssl_rounds.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["round", *keys])
            for h in self.history:
                writer.writerow([h["round"], *[h.get(k, "") for k in keys]])
        series = {k: [(h["round"], h[k]) for h in self.history if k in h] for k in ROUND_KEYS}
        if any(series.values()):
            plot_round_series(
                series,
                run_dir / "figures" / "pseudo_labels.png",
                title=f"{self.name}: pseudo-labels on the clients' unlabeled data",
                ylabel="fraction",
            )

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "fssl_history": [dict(h) for h in self.history]}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        super().load_state_dict(sd)
        self.history = [dict(h) for h in sd.get("fssl_history", [])]


def plot_round_series(
    series: Mapping[str, list[tuple[int, float]]], path: Path, title: str, ylabel: str
) -> None:
    """One line per named series of (round, value) pairs, saved as a PNG at ``path`` (matplotlib Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, points in series.items():
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=name, marker="." if len(xs) < 40 else None)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


class FixMatchLPL(SemiSupervised):
    """FedAvg + FixMatch-LPL: pseudo-labels and mask from the local model in training (baselines.md §3.3)."""

    name = "fixmatch-lpl"
    pseudo_labels = "local"
    default_mask = "teacher"


class FixMatchGPL(SemiSupervised):
    """FedAvg + FixMatch-GPL: hard pseudo-labels from the frozen global model, OR mask (methods.md §2.8).

    ``mask="teacher"`` gives baselines.md §3.4's variant (the global model's confidence only), ``"all"``
    GPL-ALL.
    """

    name = "fixmatch-gpl"
    pseudo_labels = "global"
    default_mask = "or"


# --------------------------------------------------------------------------------------------------------
# The bounds: FedAvg on the labeled samples only, and on fully labeled data
# --------------------------------------------------------------------------------------------------------
class AugmentedSupervisedTrainer(Trainer):
    """Supervised SGD with true labels on the weak view (flip + crop), the FSSL protocol's augmentation
    (baselines.md §3.1), so that the bounds differ from the FSSL methods only in what they learn from.
    Subclasses choose the training pool."""

    needs_raw_inputs = True

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.weak = Augmenter("weak")

    def pool(self, data: ClientData) -> Tensor:
        """The indices this trainer learns from, with their true labels."""
        raise NotImplementedError

    def num_steps(self, data: ClientData, ctx: TrainContext) -> int:
        """``train.local_steps`` if set, else ``local_epochs`` · ⌊|pool|/B⌋."""
        if ctx.train.local_steps:
            return int(ctx.train.local_steps)
        per_epoch = steps_per_epoch(int(self.pool(data).numel()), ctx.train.batch_size)
        return max(1, int(round(ctx.train.local_epochs * per_epoch)))

    def batches(self, data: ClientData, ctx: TrainContext) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches of B from the pool, weakly augmented, normalised."""
        normalize = _train_normalizer(data, mismatch=False)
        stream = IndexStream(self.pool(data), ctx.generator)
        for _ in range(self.num_steps(data, ctx)):
            idx = stream.take(ctx.train.batch_size)
            if idx.numel() == 0:
                return
            yield normalize(self.weak(data.inputs[idx], ctx.generator)), data.labels[idx]

    def finish(
        self,
        model: nn.Module,
        data: ClientData,
        ins: Instruction,
        state: ClientState,
        ctx: TrainContext,
        metrics: dict[str, float],
    ) -> Reply:
        """Weights and n_i = the size of the pool."""
        return Reply(
            weights=clone_weights(model.state_dict()),
            num_examples=int(self.pool(data).numel()),
            metrics=metrics,
        )


class LabeledOnlyTrainer(AugmentedSupervisedTrainer):
    """The lower bound's client: the labeled set L_i only."""

    def pool(self, data: ClientData) -> Tensor:
        return data.indices


class FullySupervisedTrainer(AugmentedSupervisedTrainer):
    """The upper bound's client: all of U_i (which holds the labeled samples too), with true labels."""

    def pool(self, data: ClientData) -> Tensor:
        return FixMatchTrainer.unlabeled_indices(data)


class AugmentedSupervised(FedAvg):
    """FedAvg whose clients train on a pool with the FSSL protocol's weak augmentation."""

    trainer_class: type[Trainer] = AugmentedSupervisedTrainer

    def __init__(self, weighting: str = "samples", reward: str = "none") -> None:
        super().__init__(weighting=weighting, reward=reward)


class LabeledOnly(AugmentedSupervised):
    """FedAvg on the labeled samples only, weak view (the FSSL lower bound, baselines.md §3.1-3.2)."""

    name = "fedavg-labeled"
    trainer_class = LabeledOnlyTrainer


class FullySupervised(AugmentedSupervised):
    """FedAvg-SL, the upper bound (baselines.md §3.2): FedAvg with every training sample labeled."""

    name = "fedavg-full"
    trainer_class = FullySupervisedTrainer
