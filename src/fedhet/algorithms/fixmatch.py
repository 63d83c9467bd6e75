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

Here: the client update (:class:`FixMatchTrainer`), the server (:class:`SemiSupervised`), FixMatch-LPL/GPL
and the bounds. The settings, pseudo-targets, masked KL, index streams and weak/strong batches they share
with SAGE, ProxyFL and FedProto+FSSL are in ``fssl.py``.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.algorithms.fedavg import FedAvg, SGDTrainer
from fedhet.algorithms.fssl import (
    IndexStream,
    PseudoTargets,
    SemiSupervisedBatch,
    SemiSupervisedSettings,
    SemiSupervisedStep,
    masked_kl_divergence,
    pool_metrics,
    pseudo_targets,
    steps_per_epoch,
    train_normalizer,
    unlabeled_indices,
)
from fedhet.algorithms.params import check_flag, is_finite_number
from fedhet.data.augment import Augmenter
from fedhet.engine.protocol import ClientData, ConfigValue, Instruction, LocalUpdate, Reply, Trainer
from fedhet.engine.weights import clone_weights
from fedhet.errors import ConfigError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

__all__ = [
    "LABELED_REPEAT",
    "FixMatchGPL",
    "FixMatchLPL",
    "FixMatchTrainer",
    "FullySupervised",
    "FullySupervisedTrainer",
    "SemiSupervised",
    "is_finite_number",
]


#: The reference's labeled dataset wrapper repeats its index list 2000 times and reports that length, so its
#: FedAvg weights are 2000·|L_i| + |U_i| (methods.md §2.6 step 1, quirk ``inflated_labeled_weights``).
LABELED_REPEAT = 2000


# --------------------------------------------------------------------------------------------------------
# The client: FixMatch local update
# --------------------------------------------------------------------------------------------------------
#: ``TrainContext.shared`` key of the optimizer state the ``shared_optimizer`` quirk hands between clients.
SHARED_OPTIMIZER_KEY = "fixmatch.optimizer"


class FixMatchTrainer(SGDTrainer):
    """FixMatch local update on labeled + unlabeled batches (methods.md §2.4 steps 1-7, baselines.md §3.3).

    Hooks for methods built on it: :meth:`make_pseudo_targets` (SAGE), :meth:`extra_losses` (ICPL, FedProto),
    :meth:`observe` (per-step bookkeeping, e.g. class counts), :meth:`payload` (extra reply tensors). The
    settings of the round are read from the instruction into ``u.scratch.settings``.
    """

    needs_raw_inputs = True

    def num_examples(self, data: ClientData) -> int:
        """n_i = |L_i| + |U_i| (baselines.md §3.1)."""
        unlabeled = int(data.unlabeled_indices.numel()) if data.unlabeled_indices is not None else 0
        return data.num_examples + unlabeled

    # -- set-up --------------------------------------------------------------------------------------------
    def prepare(self, u: LocalUpdate) -> None:
        """Read the settings, freeze a copy of the round's global model (GPL / OR mask), reset the stats."""
        s = SemiSupervisedSettings.from_config(u.config)
        if s.shared_optimizer and u.context.shared is None:
            raise ConfigError(
                "method.params.shared_optimizer=true hands one client's optimizer state to the next through "
                "memory all clients share; only the embedded simulation offers it. Set it to false"
            )
        scratch = u.scratch
        scratch.settings = s
        scratch.normalize = train_normalizer(u.data, s.normalization_mismatch)
        scratch.weak = Augmenter("weak", pad=s.crop_padding, flip=s.flip)
        scratch.strong = Augmenter("strong", pad=s.crop_padding, flip=s.flip, cutout=s.cutout)
        scratch.stats = defaultdict(float)
        #: Whether the frozen global model also predicts the labeled batch (ProxyFL's ICPL uses p_x^G).
        scratch.global_on_labeled = False
        scratch.teacher = None
        if s.needs_global_model and s.unlabeled_ratio > 0:
            teacher = copy.deepcopy(u.model)
            teacher.eval()
            teacher.requires_grad_(False)
            scratch.teacher = teacher

    def make_optimizer(self, u: LocalUpdate) -> torch.optim.Optimizer:
        """The configured optimizer; with ``shared_optimizer`` it resumes the previous client's momentum
        buffers (the reference creates one SGD object for all clients and rounds, methods.md §2.4)."""
        optimizer = super().make_optimizer(u)
        shared = u.context.shared
        if u.scratch.settings.shared_optimizer and shared.get(SHARED_OPTIMIZER_KEY) is not None:
            lr = optimizer.param_groups[0]["lr"]
            optimizer.load_state_dict(shared[SHARED_OPTIMIZER_KEY])
            for group in optimizer.param_groups:
                group["lr"] = lr
        u.scratch.optimizer = optimizer
        return optimizer

    # -- data ----------------------------------------------------------------------------------------------
    def num_steps(self, u: LocalUpdate) -> int:
        """``train.local_steps`` if set, else ``local_epochs`` · ⌊|U_i|/B⌋ (methods.md §2.4)."""
        train = u.context.train
        if train.local_steps:
            return int(train.local_steps)
        per_epoch = steps_per_epoch(int(unlabeled_indices(u.data).numel()), train.batch_size)
        return max(1, int(round(train.local_epochs * per_epoch)))

    def batches(self, u: LocalUpdate) -> Iterator[SemiSupervisedBatch]:
        """Labeled batches of B and unlabeled batches of μ·B (weak + strong views), augmented, normalised."""
        data, gen, sc = u.data, u.context.generator, u.scratch
        batch_size = u.context.train.batch_size
        unlabeled_size = sc.settings.unlabeled_ratio * batch_size
        unlabeled = unlabeled_indices(data)
        labeled_stream = IndexStream(data.indices, gen)
        unlabeled_stream = IndexStream(unlabeled, gen)
        steps = self.num_steps(u)
        last_epoch_start = steps - steps_per_epoch(int(unlabeled.numel()), batch_size)
        norm = sc.normalize
        for step in range(steps):
            li = labeled_stream.take(batch_size)
            ui = unlabeled_stream.take(unlabeled_size)
            raw_x = data.inputs.index_select(0, li)
            x = norm(sc.weak(raw_x, gen)) if li.numel() else norm(raw_x)
            raw_u = data.inputs.index_select(0, ui)
            if ui.numel():
                weak, strong = norm(sc.weak(raw_u, gen)), norm(sc.strong(raw_u, gen))
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
    def global_predictions(self, u: LocalUpdate, batch: SemiSupervisedBatch) -> tuple[Tensor, Tensor | None]:
        """softmax(G(u_w)/T) and, for ProxyFL, softmax(G(x)/T) from the frozen global model (eval mode)."""
        temperature = u.scratch.settings.temperature
        num_labeled = batch.labeled.shape[0] if u.scratch.global_on_labeled else 0
        inputs = torch.cat([batch.labeled, batch.weak]) if num_labeled else batch.weak
        probs = torch.softmax(u.scratch.teacher(inputs) / temperature, dim=1)
        return probs[num_labeled:], (probs[:num_labeled] if num_labeled else None)

    def make_pseudo_targets(self, u: LocalUpdate, step: SemiSupervisedStep) -> PseudoTargets:
        """Pseudo-targets and mask for the strong views (override for SAGE's corrected targets)."""
        s = u.scratch.settings
        return pseudo_targets(
            step.local_probs,
            step.global_probs,
            pseudo_labels=s.pseudo_labels,
            mask=s.mask,
            targets=s.targets,
            threshold=s.threshold,
        )

    def extra_losses(self, u: LocalUpdate, step: SemiSupervisedStep) -> dict[str, Tensor]:
        """Extra weighted loss terms by name (ProxyFL's ICPL, FedProto's prototype term); none here."""
        return {}

    def loss(self, u: LocalUpdate, batch: SemiSupervisedBatch) -> Tensor:
        """L_s + λ_u·L_u + extra terms for one step, from one forward pass of [x; u_w; u_s]."""
        s, model = u.scratch.settings, u.model
        nb, nu = batch.labeled.shape[0], batch.weak.shape[0]
        inputs = torch.cat([batch.labeled, batch.weak, batch.strong])
        features = model.features(inputs)
        logits = model.head(features)
        step = SemiSupervisedStep(batch, features, logits, nb, nu)
        total = logits.sum() * 0.0
        if nb:  # a client without labels (split param labeled_clients) has no supervised term, not a zero one
            total = F.cross_entropy(logits[:nb], batch.labels)
            step.losses["loss_supervised"] = total.detach()
        if nu:
            step.local_probs = torch.softmax(logits[nb : nb + nu].detach() / s.temperature, dim=1)
            if u.scratch.teacher is not None and s.needs_global_model:
                step.global_probs, step.global_probs_labeled = self.global_predictions(u, batch)
            step.pseudo = self.make_pseudo_targets(u, step)
            loss_u = masked_kl_divergence(step.pseudo.targets, logits[nb + nu :], step.pseudo.mask)
            step.losses["loss_unlabeled"] = loss_u.detach()
            total = total + s.unlabeled_weight * loss_u
        for name, term in self.extra_losses(u, step).items():
            step.losses[name] = term.detach()
            total = total + term
        self.observe(u, step)
        return total

    def observe(self, u: LocalUpdate, step: SemiSupervisedStep) -> None:
        """Accumulate loss means and, in the last epoch, the pseudo-label statistics (methods.md §2.7).

        The sums stay tensors on the device (float64, as Python float sums would be): a ``float()`` per step
        would wait for the device every step. :meth:`finish` turns them into numbers once.
        """
        stats = u.scratch.stats
        stats["steps"] += 1
        for name, value in step.losses.items():
            stats[name] += value.double()
        if step.pseudo is None or not step.batch.last_epoch:
            return
        correct = step.pseudo.labels == step.batch.unlabeled_truth
        used = step.pseudo.mask > 0
        stats["pseudo_total"] += float(step.num_unlabeled)
        stats["pseudo_correct"] += correct.sum().double()
        stats["pseudo_used"] += used.sum().double()
        stats["pseudo_used_correct"] += (correct & used).sum().double()

    # -- the reply -----------------------------------------------------------------------------------------
    def payload(self, u: LocalUpdate) -> dict[str, Tensor]:
        """Extra tensors for the server (ProxyFL's class counts, FedProto's prototypes); none here."""
        return {}

    def finish(self, u: LocalUpdate, metrics: dict[str, float]) -> Reply:
        """Weights, n_i = |L_i| + |U_i| (baselines.md §3.1), loss means, pseudo-label counts, payload."""
        if u.scratch.settings.shared_optimizer:
            u.context.shared[SHARED_OPTIMIZER_KEY] = copy.deepcopy(u.scratch.optimizer.state_dict())
        stats = {key: float(value) for key, value in u.scratch.stats.items()}
        steps = max(stats.pop("steps", 0.0), 1.0)
        for key in list(stats):
            if key.startswith("loss_"):
                metrics[key] = stats.pop(key) / steps
        metrics.update(stats)
        metrics["num_labeled"] = float(u.data.num_examples)
        return Reply(
            weights=clone_weights(u.model.state_dict()),
            num_examples=self.num_examples(u.data),
            metrics=metrics,
            payload=self.payload(u),
        )


# --------------------------------------------------------------------------------------------------------
# The server: FedAvg plus per-round pseudo-label bookkeeping
# --------------------------------------------------------------------------------------------------------
class SemiSupervised(FedAvg):
    """FedAvg of FixMatch-trained clients (baselines.md §3.1); the base of LPL, GPL, SAGE, ProxyFL, FedProto.

    Parameters (paper defaults): ``threshold`` τ = 0.95, ``unlabeled_ratio`` μ = 2, ``temperature`` T = 1,
    ``unlabeled_weight`` λ_u = 1, ``mask`` (None = the method's own), ``targets`` "hard" | "soft". Code
    quirks, off by default: ``shared_optimizer`` (simulation-only), ``inflated_labeled_weights``
    (n_i = 2000·|L_i| + |U_i|), ``normalization_mismatch`` (CIFAR-10 training normalisation, methods.md §2.2).
    Augmentation: ``flip`` (true; the reference flips SVHN too), ``crop_padding`` 4 px, ``cutout`` 16 px at
    32x32 (scaled with size). Each round's pooled pseudo-label statistics go into metrics.jsonl.
    """

    name = "fssl"
    model_needs = frozenset({"head"})
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
        self.inflated_labeled_weights = check_flag("inflated_labeled_weights", inflated_labeled_weights)
        #: This round's record: pooled pseudo-label statistics and mean losses (methods add theirs).
        self.round_record: dict[str, Any] = {}

    def simulation_only(self) -> list[str]:
        return (
            ["shared_optimizer (one optimizer state handed from client to client)"]
            if self.settings.shared_optimizer
            else []
        )

    # -- hooks ---------------------------------------------------------------------------------------------
    def client_config(self, rnd: int) -> dict[str, ConfigValue]:
        """Config entries every client receives this round (subclasses add theirs)."""
        return self.settings.to_config()

    def client_payload(self, rnd: int) -> dict[str, Tensor]:
        """Extra tensors every client receives this round (``Instruction.payload``; subclasses add theirs)."""
        return {}

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """The global model, the FixMatch settings and the method's extra tensors for every client."""
        weights = self.global_weights()
        payload = self.client_payload(rnd)
        config = self.client_config(rnd)
        return {
            cid: Instruction(weights=weights, payload=dict(payload), config=dict(config))
            for cid in client_ids
        }

    def aggregation_weights(self, rnd: int, replies: Mapping[int, Reply]) -> np.ndarray:
        """n_i = |L_i| + |U_i|; with ``inflated_labeled_weights`` the reference's 2000·|L_i| + |U_i|."""
        weights = super().aggregation_weights(rnd, replies)
        if self.inflated_labeled_weights and self.weighting == "samples":
            labeled = np.array([replies[c].metrics.get("num_labeled", 0.0) for c in sorted(replies)])
            weights = weights + (LABELED_REPEAT - 1) * labeled
        return weights

    def before_aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        """Pool the clients' pseudo-label counts and mean losses into this round's record."""
        self.round_record = pool_metrics(replies)

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        """This round's pseudo-label numbers and mean losses (into metrics.jsonl)."""
        return {**super().round_metrics(rnd), **self.round_record}

    def run_records(self) -> dict[str, Any]:
        """Marks the run for the report's ``fssl_rounds.csv`` and pseudo-label figure."""
        return {"fssl": {"method": self.name}}


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
class AugmentedSupervisedTrainer(SGDTrainer):
    """Supervised SGD with true labels on the weak view (flip + crop), the FSSL protocol's augmentation
    (baselines.md §3.1), so that the bounds differ from the FSSL methods only in what they learn from.
    Subclasses choose the training pool."""

    needs_raw_inputs = True

    def __init__(self) -> None:
        self.weak = Augmenter("weak")

    def pool(self, data: ClientData) -> Tensor:
        """The indices this trainer learns from, with their true labels."""
        raise NotImplementedError

    def num_examples(self, data: ClientData) -> int:
        """n_i = the size of the pool."""
        return int(self.pool(data).numel())

    def num_steps(self, u: LocalUpdate) -> int:
        """``train.local_steps`` if set, else ``local_epochs`` · ⌊|pool|/B⌋."""
        train = u.context.train
        if train.local_steps:
            return int(train.local_steps)
        per_epoch = steps_per_epoch(self.num_examples(u.data), train.batch_size)
        return max(1, int(round(train.local_epochs * per_epoch)))

    def batches(self, u: LocalUpdate) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches of B from the pool, weakly augmented, normalised."""
        data, gen = u.data, u.context.generator
        normalize = train_normalizer(data, mismatch=False)
        stream = IndexStream(self.pool(data), gen)
        for _ in range(self.num_steps(u)):
            idx = stream.take(u.context.train.batch_size)
            if idx.numel() == 0:
                return
            batch = data.inputs.index_select(0, idx)
            yield normalize(self.weak(batch, gen)), data.labels.index_select(0, idx)


class LabeledOnlyTrainer(AugmentedSupervisedTrainer):
    """The lower bound's client: the labeled set L_i only."""

    def pool(self, data: ClientData) -> Tensor:
        return data.indices


class FullySupervisedTrainer(AugmentedSupervisedTrainer):
    """The upper bound's client: all of U_i (which holds the labeled samples too), with true labels."""

    def pool(self, data: ClientData) -> Tensor:
        return unlabeled_indices(data)


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
