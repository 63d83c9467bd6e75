"""FedProto (Tan et al., AAAI 2022) on top of FixMatch-GPL: "FedProto + FSSL" of ProxyFL's Table 5.

Spec: baselines.md §3.7 (yuetan031/FedProto ``lib/update.py::update_weights_het``; the FSSL variants are
paper-only). Local loss = the GPL loss + λ·MSE(f(x), P̄_y), f the backbone features and P̄_y the global
prototype of the sample's (pseudo-)class, skipped for classes without one. Which samples take part, both in
the term and in the uploaded class means (``prototype_samples``):

* ``"confident"`` (PROTO): labeled samples + unlabeled weak views that pass the mask, with their global
  pseudo-labels;
* ``"all"`` (PROTO-ALL): labeled + every unlabeled weak view;
* ``"labeled"`` (PROTO-Labeled): labeled samples only.

Clients upload per-class feature sums and counts (``Reply.payload``); the server's prototype of class c is
the mean of the clients' class means (``prototype_aggregation="clients"``, FedProto's ``proto_aggregation``)
or the sample-weighted mean (``"samples"``); classes no client saw keep their previous prototype.
[ours]: class means are taken over the last local epoch (as ProxyFL's counts), λ = 1.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fedhet.algorithms.fixmatch import FixMatchGPL, FixMatchTrainer
from fedhet.algorithms.fssl import SemiSupervisedStep
from fedhet.algorithms.params import check_choice, check_number
from fedhet.engine.protocol import ConfigValue, FederationInfo, LocalUpdate, Reply
from fedhet.errors import ConfigError, ProtocolError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

log = logging.getLogger("fedhet")

PROTOTYPE_SAMPLES = ("confident", "all", "labeled")
PROTOTYPE_AGGREGATIONS = ("clients", "samples")
#: Instruction.payload keys of the global prototypes (C, D) and of which classes have one (C,).
PROTOTYPES_KEY = "fedproto.prototypes"
PRESENT_KEY = "fedproto.present"


def prototype_members(step: SemiSupervisedStep, samples: str) -> tuple[Tensor, Tensor, Tensor]:
    """Features (n, D), classes (n,) and 0/1 weights (n,) of the samples that join the prototype term:
    labeled rows with their labels, and (unless ``samples="labeled"``) weak unlabeled rows with their
    pseudo-labels, weighted by the mask for ``"confident"``. Weights, not a selection: a boolean index has a
    data-dependent shape, which would wait for the device every step."""
    nb, nu = step.num_labeled, step.num_unlabeled
    feats, labels = [step.features[:nb]], [step.batch.labels]
    weights = [torch.ones(nb, dtype=step.features.dtype, device=step.features.device)]
    if samples != "labeled" and step.pseudo is not None and nu:
        feats.append(step.features[nb : nb + nu])
        labels.append(step.pseudo.labels)
        keep = step.pseudo.mask if samples == "confident" else torch.ones_like(step.pseudo.mask)
        weights.append((keep > 0).to(step.features.dtype))
    return torch.cat(feats), torch.cat(labels), torch.cat(weights)


def prototype_loss(
    features: Tensor, labels: Tensor, prototypes: Tensor, present: Tensor, weights: Tensor | None = None
) -> Tensor:
    """MSE(f, P̄_y) averaged over the (weighted) samples whose class has a global prototype, and over
    dimensions; 0 when there is none."""
    keep = present.bool()[labels].to(features.dtype)
    if weights is not None:
        keep = keep * weights
    squared = (features - prototypes[labels].to(features.dtype)).pow(2).mean(dim=1)
    return (keep * squared).sum() / keep.sum().clamp_min(1.0)


def aggregate_prototypes(
    sums: Tensor, counts: Tensor, previous: Tensor, previous_present: Tensor, weighting: str = "clients"
) -> tuple[Tensor, Tensor]:
    """Global prototypes from clients' per-class feature sums (M, C, D) and counts (M, C): the mean of the
    clients' class means (``"clients"``) or of all their samples (``"samples"``); unseen classes keep
    ``previous``. Returns (prototypes (C, D), present (C,) bool)."""
    seen = counts > 0
    if weighting == "samples":
        total = counts.sum(dim=0)
        means = sums.sum(dim=0) / total.clamp_min(1).unsqueeze(1)
    elif weighting == "clients":
        client_means = sums / counts.clamp_min(1).unsqueeze(2)
        weights = seen.to(sums.dtype)
        means = (client_means * weights.unsqueeze(2)).sum(dim=0) / weights.sum(dim=0).clamp_min(1).unsqueeze(
            1
        )
    else:
        raise ConfigError(f"prototype_aggregation={weighting!r}; accepted: {list(PROTOTYPE_AGGREGATIONS)}")
    any_seen = seen.any(dim=0)
    prototypes = torch.where(any_seen.unsqueeze(1), means.to(previous.dtype), previous)
    return prototypes, any_seen | previous_present.bool()


class FedProtoTrainer(FixMatchTrainer):
    """FixMatch-GPL with FedProto's prototype term; uploads per-class feature sums and counts."""

    def prepare(self, u: LocalUpdate) -> None:
        super().prepare(u)
        sc = u.scratch
        sc.prototype_weight = float(u.config.get("fedproto.weight", 1.0))
        sc.prototype_samples = str(u.config.get("fedproto.samples", "confident"))
        prototypes = u.instruction.payload.get(PROTOTYPES_KEY)
        present = u.instruction.payload.get(PRESENT_KEY)
        if prototypes is None or present is None:
            raise ProtocolError(
                "the FedProto trainer needs the global prototypes from the server (Instruction.payload"
                f"['{PROTOTYPES_KEY}'] and ['{PRESENT_KEY}']); run it with 'fedproto-fssl'"
            )
        device = u.data.inputs.device
        # Read on the CPU copy the instruction brought: asking the device every step would wait for it.
        sc.any_prototype = bool(present.bool().any())
        sc.prototypes = prototypes.to(device)
        sc.present = present.to(device).bool()
        sc.feature_sums = torch.zeros(tuple(sc.prototypes.shape), dtype=torch.float64, device=device)
        sc.feature_counts = torch.zeros(sc.prototypes.shape[0], dtype=torch.float64, device=device)

    def extra_losses(self, u: LocalUpdate, step: SemiSupervisedStep) -> dict[str, Tensor]:
        """λ·MSE(f, P̄_y) over the chosen samples (none in round 1, before any prototype exists)."""
        sc = u.scratch
        if sc.prototype_weight == 0.0 or not sc.any_prototype:
            return {}
        feats, labels, weights = prototype_members(step, sc.prototype_samples)
        loss = prototype_loss(feats, labels, sc.prototypes, sc.present, weights)
        return {"loss_prototype": sc.prototype_weight * loss}

    def observe(self, u: LocalUpdate, step: SemiSupervisedStep) -> None:
        """Also accumulate per-class feature sums in the last epoch (the prototypes to upload), on the
        device: they reach the CPU once, in the reply."""
        super().observe(u, step)
        if not step.batch.last_epoch:
            return
        sc = u.scratch
        feats, labels, weights = prototype_members(step, sc.prototype_samples)
        weights = weights.detach().double()
        sc.feature_sums.index_add_(0, labels, feats.detach().double() * weights.unsqueeze(1))
        sc.feature_counts.index_add_(0, labels, weights)

    def payload(self, u: LocalUpdate) -> dict[str, Tensor]:
        return {
            "prototype_sums": u.scratch.feature_sums.cpu().clone(),
            "prototype_counts": u.scratch.feature_counts.cpu().clone(),
        }


class FedProtoFSSL(FixMatchGPL):
    """FedProto + FSSL: FixMatch-GPL plus FedProto's prototype MSE term (ProxyFL Table 5's PROTO rows).

    ``prototype_weight`` λ = 1, ``prototype_samples`` "confident" (PROTO) | "all" (PROTO-ALL) | "labeled"
    (PROTO-Labeled), ``prototype_aggregation`` "clients" (FedProto) | "samples".
    """

    name = "fedproto-fssl"
    trainer_class = FedProtoTrainer

    def __init__(
        self,
        prototype_weight: float = 1.0,
        prototype_samples: str = "confident",
        prototype_aggregation: str = "clients",
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.prototype_weight = check_number("prototype_weight", prototype_weight, 0.0)
        self.prototype_samples = check_choice("prototype_samples", prototype_samples, PROTOTYPE_SAMPLES)
        self.prototype_aggregation = check_choice(
            "prototype_aggregation", prototype_aggregation, PROTOTYPE_AGGREGATIONS
        )
        self.prototypes: Tensor | None = None
        self.present: Tensor | None = None

    def setup(self, info: FederationInfo) -> None:
        """No prototypes before the first round; their dimension is the model's feature size."""
        super().setup(info)
        dim = int(info.model.head.in_features)
        self.prototypes = torch.zeros(info.num_classes, dim)
        self.present = torch.zeros(info.num_classes, dtype=torch.bool)

    def client_config(self, rnd: int) -> dict[str, ConfigValue]:
        return {
            **super().client_config(rnd),
            "fedproto.weight": self.prototype_weight,
            "fedproto.samples": self.prototype_samples,
        }

    def client_payload(self, rnd: int) -> dict[str, Tensor]:
        return {PROTOTYPES_KEY: self.prototypes, PRESENT_KEY: self.present}

    def after_aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        """After FedAvg: the global prototypes from the clients' class sums."""
        sums, counts = [], []
        shape = tuple(self.prototypes.shape)
        for cid in sorted(replies):
            s = replies[cid].payload.get("prototype_sums")
            n = replies[cid].payload.get("prototype_counts")
            ok = (
                isinstance(s, Tensor)
                and isinstance(n, Tensor)
                and tuple(s.shape) == shape
                and tuple(n.shape) == shape[:1]
                and bool(torch.isfinite(s).all())
                and bool((n >= 0).all())
            )
            if not ok:
                log.warning(
                    "round %d: client %d sent no valid prototypes of shape %s; left out", rnd, cid, shape
                )
                continue
            sums.append(s.double().cpu())
            counts.append(n.double().cpu())
        if sums:
            protos, present = aggregate_prototypes(
                torch.stack(sums),
                torch.stack(counts),
                self.prototypes.double(),
                self.present,
                self.prototype_aggregation,
            )
            self.prototypes, self.present = protos.float(), present
        self.round_record["prototype_classes"] = int(self.present.sum())

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "fedproto_prototypes": self.prototypes.clone(),
            "fedproto_present": self.present.clone(),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        super().load_state_dict(sd)
        self.prototypes = torch.as_tensor(sd["fedproto_prototypes"]).float().clone()
        self.present = torch.as_tensor(sd["fedproto_present"]).bool().clone()
