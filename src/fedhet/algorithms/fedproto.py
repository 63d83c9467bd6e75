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
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.algorithms.fixmatch import FixMatchGPL, FixMatchTrainer, SemiSupervisedStep, is_finite_number
from fedhet.engine.protocol import ClientData, ClientState, ConfigValue, Instruction, Reply, TrainContext
from fedhet.errors import ConfigError

log = logging.getLogger("fedhet")

PROTOTYPE_SAMPLES = ("confident", "all", "labeled")
PROTOTYPE_AGGREGATIONS = ("clients", "samples")
_PROTOTYPES_KEY = "fedproto.prototypes"
_PRESENT_KEY = "fedproto.present"


def prototype_members(step: SemiSupervisedStep, samples: str) -> tuple[Tensor, Tensor]:
    """Features (n, D) and classes (n,) of the samples that join the prototype term: labeled rows with
    their labels, and (unless ``samples="labeled"``) weak unlabeled rows with their pseudo-labels."""
    nb, nu = step.num_labeled, step.num_unlabeled
    feats, labels = [step.features[:nb]], [step.batch.labels]
    if samples != "labeled" and step.pseudo is not None and nu:
        weak = step.features[nb : nb + nu]
        keep = torch.ones(nu, dtype=torch.bool, device=weak.device)
        if samples == "confident":
            keep = step.pseudo.mask > 0
        feats.append(weak[keep])
        labels.append(step.pseudo.labels[keep])
    return torch.cat(feats), torch.cat(labels)


def prototype_loss(features: Tensor, labels: Tensor, prototypes: Tensor, present: Tensor) -> Tensor:
    """MSE(f, P̄_y) averaged over the samples whose class has a global prototype (and over dimensions)."""
    keep = present.bool()[labels]
    if not bool(keep.any()):
        return features.sum() * 0.0
    return F.mse_loss(features[keep], prototypes[labels[keep]].to(features.dtype))


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

    def prepare(
        self, model: nn.Module, data: ClientData, ins: Instruction, state: ClientState, ctx: TrainContext
    ) -> None:
        super().prepare(model, data, ins, state, ctx)
        self.prototype_weight = float(ins.config.get("fedproto.weight", 1.0))
        self.prototype_samples = str(ins.config.get("fedproto.samples", "confident"))
        prototypes = self.server_tensors.get(_PROTOTYPES_KEY)
        present = self.server_tensors.get(_PRESENT_KEY)
        if prototypes is None or present is None:
            raise ConfigError(
                "the FedProto trainer needs the global prototypes from the server (Instruction.weights"
                f"['server.{_PROTOTYPES_KEY}'] and ['server.{_PRESENT_KEY}']); run it with 'fedproto-fssl'"
            )
        self.prototypes = prototypes.to(data.inputs.device)
        self.present = present.to(data.inputs.device).bool()
        self.feature_sums = torch.zeros(tuple(self.prototypes.shape), dtype=torch.float64)
        self.feature_counts = torch.zeros(self.prototypes.shape[0], dtype=torch.float64)

    def extra_losses(self, model: nn.Module, step: SemiSupervisedStep, ins: Instruction) -> dict[str, Tensor]:
        """λ·MSE(f, P̄_y) over the chosen samples (none in round 1, before any prototype exists)."""
        if self.prototype_weight == 0.0 or not bool(self.present.any()):
            return {}
        feats, labels = prototype_members(step, self.prototype_samples)
        return {
            "loss_prototype": self.prototype_weight
            * prototype_loss(feats, labels, self.prototypes, self.present)
        }

    def observe(self, step: SemiSupervisedStep) -> None:
        """Also accumulate per-class feature sums in the last epoch (the prototypes to upload)."""
        super().observe(step)
        if not step.batch.last_epoch:
            return
        feats, labels = prototype_members(step, self.prototype_samples)
        feats = feats.detach().double().cpu()
        labels = labels.cpu()
        self.feature_sums.index_add_(0, labels, feats)
        self.feature_counts += torch.bincount(labels, minlength=self.feature_counts.shape[0]).double()

    def payload(self, data: ClientData) -> dict[str, Tensor]:
        return {"prototype_sums": self.feature_sums.clone(), "prototype_counts": self.feature_counts.clone()}


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
        if not is_finite_number(prototype_weight) or prototype_weight < 0:
            raise ConfigError(f"method.params.prototype_weight={prototype_weight!r} must be a number >= 0")
        if prototype_samples not in PROTOTYPE_SAMPLES:
            raise ConfigError(
                f"method.params.prototype_samples={prototype_samples!r}; accepted: {list(PROTOTYPE_SAMPLES)}"
            )
        if prototype_aggregation not in PROTOTYPE_AGGREGATIONS:
            raise ConfigError(
                f"method.params.prototype_aggregation={prototype_aggregation!r}; "
                f"accepted: {list(PROTOTYPE_AGGREGATIONS)}"
            )
        self.prototype_weight = float(prototype_weight)
        self.prototype_samples = prototype_samples
        self.prototype_aggregation = prototype_aggregation
        self.prototypes: Tensor | None = None
        self.present: Tensor | None = None

    def setup(self, ctx: Any) -> None:
        """No prototypes before the first round; their dimension is the model's feature size."""
        super().setup(ctx)
        dim = int(ctx.model.head.in_features)
        self.prototypes = torch.zeros(ctx.num_classes, dim)
        self.present = torch.zeros(ctx.num_classes, dtype=torch.bool)

    def client_config(self, rnd: int) -> dict[str, ConfigValue]:
        return {
            **super().client_config(rnd),
            "fedproto.weight": self.prototype_weight,
            "fedproto.samples": self.prototype_samples,
        }

    def server_tensors(self, rnd: int) -> dict[str, Tensor]:
        return {_PROTOTYPES_KEY: self.prototypes, _PRESENT_KEY: self.present}

    def aggregate(self, rnd: int, replies: dict[int, Reply]) -> None:
        """FedAvg, then the global prototypes from the clients' class sums."""
        super().aggregate(rnd, replies)
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
        self.history[-1]["prototype_classes"] = int(self.present.sum())

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
