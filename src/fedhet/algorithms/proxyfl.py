"""ProxyFL (Chen & Wang, CVPR 2026): proxy-guided federated semi-supervised learning.

Spec: methods.md §2 (DuowenC/FSSLlib ``ProxyFL/proxyfl.py``, restated, not copied). The classifier's weight
rows ω^c are the class *proxies*. On top of FixMatch-GPL with the OR mask (methods.md §2.4):

* **ICPL** (client, §2.5): a contrastive loss over the projected features z = normalize(feat_proj(f)) of
  [x; u_w; u_s] against the projected proxies P = normalize(proxy_proj(ω)). A confident sample's positive is
  z·P_{argmax q}; a low-confidence sample's positive pools the proxies of its *indecisive set*
  ξ_n = {c : q_n(c) > π(c)} (π the global class prior) as z·Σ_{c∈ξ_n} q_n(c)·P_c. Its negatives are the
  batch samples whose predicted class sets are disjoint from its own (with cosine ≥ 1e-6). No temperature;
  CE against the positive; only unlabeled rows are anchors. q are the frozen global model's probabilities.
* **Class counts** (client, §2.4 step 10): in the last local epoch, the labels of the labeled batches plus
  the global pseudo-labels of the unlabeled samples that pass the mask; uploaded in ``Reply.payload``.
* **Server** (§2.6): FedAvg, then **GPT** (global proxy tuning): starting from the averaged classifier, the
  global proxies Ω_G are tuned by plain SGD on the uploaded local proxies {(ω_m^c, c)} with Euclidean
  distances, CE(−D, c); the code adds a margin δ = min(max_c min_{c'≠c} ‖ω̄^c − ω̄^{c'}‖, 100) to the true
  class (``gpt_margin``, on with the code's direction), the paper's formula has none; the bias keeps its
  FedAvg value. Then the prior P ← 0.99·P + 0.01·(Σ_i counts_i / Σ counts), starting
  uniform; clients of round r use the prior of round r − 1.

Code quirks (methods.md §2.2, §2.4, §2.6), each an option, the paper's behaviour by default:
``shared_optimizer``, ``inflated_labeled_weights`` and ``normalization_mismatch`` (inherited from
:class:`~fedhet.algorithms.fixmatch.SemiSupervised`), and ``gpt_direction``: ``"paper"`` normalises, for each
global proxy ω_G^c, over the same client's local proxies of all classes (the paper's formula); ``"code"``
normalises, for each local proxy ω_m^c, over the global proxies (FSSLlib's ``update_GPT``, with its margin).
methods.md §2.6 asks to implement the code's version with the paper's as an option, DESIGN.md asks for the
paper's behaviour by default: the default is the paper's formula exactly (its direction, no margin); the
reproduction tables use ``gpt_direction="code"`` (with its margin), the code behind the published numbers.

[ours]: a sample is never its own negative (the code admits it only when its class set is empty, which
needs q = π exactly); ``gpt_direction="paper"`` normalises over the local proxies of one client (the code's
per-client C×C distance matrix, read along the other axis).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.algorithms.fixmatch import FixMatchGPL, FixMatchTrainer
from fedhet.algorithms.fssl import SemiSupervisedStep
from fedhet.algorithms.params import check_choice, check_flag, check_integer, check_number
from fedhet.engine.protocol import ConfigValue, FederationInfo, LocalUpdate, Reply
from fedhet.errors import ConfigError, ProtocolError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

__all__ = [
    "GPT_DIRECTIONS",
    "INDECISIVE_RULES",
    "ProxyFL",
    "ProxyFLTrainer",
    "ProxyTuningResult",
    "candidate_class_sets",
    "global_proxy_tuning",
    "gpt_loss",
    "icpl_loss",
    "indecisive_sets",
    "proxy_margin",
    "update_class_prior",
]

log = logging.getLogger("fedhet")

GPT_DIRECTIONS = ("paper", "code")
INDECISIVE_RULES = ("prior", "top-k")
#: ICPL drops negatives whose cosine similarity to the anchor is below this (methods.md §2.5).
NEGATIVE_MIN_SIMILARITY = 1e-6
#: Instruction.payload key of the global class prior.
PRIOR_KEY = "proxyfl.prior"


# --------------------------------------------------------------------------------------------------------
# ICPL (client)
# --------------------------------------------------------------------------------------------------------
def indecisive_sets(probs: Tensor, prior: Tensor) -> Tensor:
    """ξ_n = {c : q_n(c) > π(c)} as a boolean (N, C) matrix (methods.md §2.5, the paper's prior threshold)."""
    return probs > prior.to(probs.dtype).reshape(1, -1)


def candidate_class_sets(probs: Tensor, prior: Tensor, rule: str = "prior", top_k: int = 5) -> Tensor:
    """Low-confidence candidate sets: the indecisive sets (``"prior"``) or the top-k classes (``"top-k"``,
    the paper's ablation; k = 1 is "Top-1")."""
    if rule == "prior":
        return indecisive_sets(probs, prior)
    if rule == "top-k":
        k = min(int(top_k), probs.shape[1])
        sets = torch.zeros_like(probs, dtype=torch.bool)
        return sets.scatter_(1, probs.topk(k, dim=1).indices, True)
    raise ConfigError(f"indecisive_rule={rule!r}; accepted: {list(INDECISIVE_RULES)}")


def predicted_class_sets(probs: Tensor, confident: Tensor, candidates: Tensor) -> Tensor:
    """A confident sample's set is its top-1 class; a low-confidence sample's is its candidate set."""
    top1 = F.one_hot(probs.argmax(dim=1), probs.shape[1]).bool()
    return torch.where(confident.bool().unsqueeze(1), top1, candidates)


def icpl_loss(
    embeddings: Tensor,
    proxies: Tensor,
    probs: Tensor,
    confident: Tensor,
    candidates: Tensor,
    num_labeled: int,
) -> Tensor:
    """Indecisive-categories proxy learning (methods.md §2.5) on projected features (N, D) of [x; u_w; u_s],
    projected proxies (C, D), detached probabilities q (N, C), confidence κ (N,) and candidate sets (N, C).

    Positive: z·P_{argmax q} (confident) or z·Σ_{c∈ξ} q(c)·P_c; negatives: samples with disjoint predicted
    sets and cosine ≥ 1e-6; logits [pos, negatives] without temperature, CE against the positive, averaged
    over the unlabeled anchors (rows ``num_labeled`` onward).
    """
    z = F.normalize(embeddings, p=2, dim=1)
    p = F.normalize(proxies, p=2, dim=1)
    confident = confident.bool()
    top1 = probs.argmax(dim=1)
    pooled_proxy = (probs * candidates.to(probs.dtype)) @ p
    pooled_sim = (z * pooled_proxy).sum(dim=1)
    top1_sim = (z * p[top1]).sum(dim=1)
    positive = torch.where(confident, top1_sim, pooled_sim)
    sets = predicted_class_sets(probs, confident, candidates).to(z.dtype)
    overlap = (sets @ sets.T) > 0
    similarity = z @ z.T
    eye = torch.eye(z.shape[0], dtype=torch.bool, device=z.device)
    negative = ~overlap & ~eye & (similarity >= NEGATIVE_MIN_SIMILARITY)
    logits = torch.cat([positive.unsqueeze(1), similarity.masked_fill(~negative, float("-inf"))], dim=1)
    logits = logits[num_labeled:]
    if logits.shape[0] == 0:
        return embeddings.sum() * 0.0
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))


# --------------------------------------------------------------------------------------------------------
# GPT and the prior (server)
# --------------------------------------------------------------------------------------------------------
def proxy_margin(proxies: Tensor, cap: float) -> float:
    """δ = min(max_c min_{c'≠c} ‖ω̄^c − ω̄^{c'}‖₂, cap): the largest nearest-neighbour distance among the
    averaged proxies, capped by ``gpt_threshold`` = 100 (methods.md §2.6)."""
    if proxies.shape[0] < 2:
        return float(cap)
    dist = torch.cdist(proxies.detach().double(), proxies.detach().double())
    dist.fill_diagonal_(float("inf"))
    return float(min(float(dist.min(dim=1).values.max()), float(cap)))


def gpt_loss(
    global_proxies: Tensor,
    local_proxies: Tensor,
    margin: float,
    direction: str = "paper",
    pairs: Tensor | None = None,
) -> Tensor:
    """GPT's margin cross-entropy over (client m, class c) pairs (all, or the flat indices ``pairs`` =
    m·C + c), with Euclidean distances D and δ added to the true class: CE(−D, c).

    ``"code"``: D[c'] = ‖ω_m^c − ω_G^{c'}‖, over the global proxies; ``"paper"``: D[c'] = ‖ω_G^c − ω_m^{c'}‖,
    over client m's local proxies. ``global_proxies`` (C, D), ``local_proxies`` (M, C, D).
    """
    num_clients, num_classes, dim = local_proxies.shape
    if pairs is None:
        pairs = torch.arange(num_clients * num_classes)
    pairs = pairs.to(local_proxies.device)
    client, cls = pairs // num_classes, pairs % num_classes
    if direction == "code":
        dist = torch.cdist(local_proxies[client, cls], global_proxies)
    elif direction == "paper":
        diff = global_proxies[cls].unsqueeze(1) - local_proxies[client]
        dist = torch.linalg.vector_norm(diff, dim=2)
    else:
        raise ConfigError(f"gpt_direction={direction!r}; accepted: {list(GPT_DIRECTIONS)}")
    dist = dist + margin * F.one_hot(cls, num_classes).to(dist.dtype)
    return F.cross_entropy(-dist, cls)


@dataclass
class ProxyTuningResult:
    """The tuned global proxies (C, D), the margin δ and GPT's full-set loss before and after tuning."""

    proxies: Tensor
    margin: float
    loss_before: float
    loss_after: float
    steps: int


def global_proxy_tuning(
    global_proxies: Tensor,
    local_proxies: Tensor,
    *,
    epochs: int = 100,
    batch_size: int = 4,
    lr: float = 0.005,
    margin_cap: float = 100.0,
    direction: str = "paper",
    use_margin: bool = True,
    rng: np.random.Generator,
) -> ProxyTuningResult:
    """GPT (methods.md §2.6 step 2): plain SGD on Ω_G over shuffled mini-batches of the M·C uploaded local
    proxies, ``epochs`` passes (Q = 100 for CIFAR-10), margin δ from the averaged ``global_proxies`` (δ = 0
    without ``use_margin``: the paper's formula has none)."""
    local = local_proxies.detach().to(global_proxies.dtype)
    tuned = global_proxies.detach().clone().requires_grad_(True)
    margin = proxy_margin(global_proxies, margin_cap) if use_margin else 0.0
    with torch.no_grad():
        before = float(gpt_loss(tuned, local, margin, direction))
    optimizer = torch.optim.SGD([tuned], lr=lr)
    count = local.shape[0] * local.shape[1]
    steps = 0
    for _ in range(epochs):
        order = torch.as_tensor(rng.permutation(count), dtype=torch.long)
        for start in range(0, count, batch_size):
            optimizer.zero_grad(set_to_none=True)
            gpt_loss(tuned, local, margin, direction, order[start : start + batch_size]).backward()
            optimizer.step()
            steps += 1
    with torch.no_grad():
        after = float(gpt_loss(tuned, local, margin, direction))
    return ProxyTuningResult(tuned.detach(), margin, before, after, steps)


def update_class_prior(prior: Tensor, counts: Tensor, momentum: float = 0.99) -> Tensor:
    """P ← β·P + (1 − β)·(Σ_i counts_i / Σ counts) with β = 0.99 (methods.md §2.6 step 3); ``counts`` (M, C)
    or (C,); a round without any counted sample leaves P unchanged."""
    total = counts.double().reshape(-1, prior.shape[0]).sum(dim=0)
    if float(total.sum()) <= 0:
        return prior.clone()
    return momentum * prior.double() + (1.0 - momentum) * total / total.sum()


# --------------------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------------------
def _require_proxy_heads(model: nn.Module) -> None:
    missing = [name for name in ("feat_proj", "proxy_proj", "head") if not hasattr(model, name)]
    if missing:
        raise ConfigError(
            f"ProxyFL's ICPL needs a model with feat_proj, proxy_proj and head (use model.name='resnet8'); "
            f"{type(model).__name__} lacks {missing}. Or set method.params.icpl=false"
        )


class ProxyFLTrainer(FixMatchTrainer):
    """FixMatch-GPL (OR mask) + ICPL, counting classes in the last local epoch (methods.md §2.4, §2.5)."""

    def prepare(self, u: LocalUpdate) -> None:
        super().prepare(u)
        cfg, sc = u.config, u.scratch
        sc.icpl = bool(cfg.get("proxyfl.icpl", True))
        sc.icpl_weight = float(cfg.get("proxyfl.icpl_weight", 1.0))
        sc.indecisive_rule = str(cfg.get("proxyfl.indecisive_rule", "prior"))
        sc.indecisive_top_k = int(cfg.get("proxyfl.indecisive_top_k", 5))
        sc.global_on_labeled = sc.icpl
        prior = u.instruction.payload.get(PRIOR_KEY)
        if prior is None:
            raise ProtocolError(
                f"the ProxyFL trainer needs the global class prior from the server (Instruction.payload"
                f"['{PRIOR_KEY}']); run it with the 'proxyfl' strategy"
            )
        sc.prior = prior.to(u.data.inputs.device, torch.float32)
        if sc.icpl:
            _require_proxy_heads(u.model)
        sc.class_counts = torch.zeros(u.data.num_classes, dtype=torch.float64, device=u.data.inputs.device)

    def extra_losses(self, u: LocalUpdate, step: SemiSupervisedStep) -> dict[str, Tensor]:
        """L_c = ICPL over [x; u_w; u_s] with q = [p_x^G; p_u^G; p_u^G] and κ = [m_x; m; m]."""
        sc = u.scratch
        if not sc.icpl or step.pseudo is None or step.global_probs is None:
            return {}
        threshold = sc.settings.threshold
        probs_u, mask_u = step.global_probs, step.pseudo.mask.bool()
        probs, confident = [probs_u, probs_u], [mask_u, mask_u]
        if step.num_labeled:
            probs_x = step.global_probs_labeled
            probs.insert(0, probs_x)
            confident.insert(0, probs_x.max(dim=1).values >= threshold)
        probs_all = torch.cat(probs).detach()
        candidates = candidate_class_sets(probs_all, sc.prior, sc.indecisive_rule, sc.indecisive_top_k)
        model = u.model
        loss = icpl_loss(
            model.feat_proj(step.features),
            model.proxy_proj(model.head.weight),
            probs_all,
            torch.cat(confident),
            candidates,
            step.num_labeled,
        )
        return {"loss_icpl": sc.icpl_weight * loss}

    def observe(self, u: LocalUpdate, step: SemiSupervisedStep) -> None:
        """Also count classes in the last epoch: true labels of x, global pseudo-labels where m = 1."""
        super().observe(u, step)
        if not step.batch.last_epoch:
            return
        # index_add_ on the device: bincount and boolean indexing would each wait for the device (host sync)
        counts = u.scratch.class_counts
        labels = step.batch.labels
        counts.index_add_(0, labels, torch.ones_like(labels, dtype=counts.dtype))
        if step.pseudo is not None:
            used = (step.pseudo.mask > 0).to(counts.dtype)
            counts.index_add_(0, step.pseudo.labels, used)

    def payload(self, u: LocalUpdate) -> dict[str, Tensor]:
        return {"class_counts": u.scratch.class_counts.cpu().clone()}


# --------------------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------------------
class ProxyFL(FixMatchGPL):
    """ProxyFL: FixMatch-GPL + ICPL on the clients; FedAvg, proxy tuning (GPT) and a class prior (server).

    Options (paper defaults): ``gpt``/``icpl`` (ablations), ``icpl_weight`` β = 1, ``prior_momentum`` 0.99,
    ``gpt_epochs`` Q = 100 (CIFAR-10/SVHN/CINIC-10; 10 for CIFAR-100), ``gpt_batch_size`` 4, ``gpt_lr`` 0.005,
    ``gpt_margin_cap`` 100, ``gpt_direction`` "paper" | "code", ``gpt_margin`` (δ on the true class;
    default true with the code's direction, false with the paper's, whose formula has none),
    ``indecisive_rule`` "prior" | "top-k"
    (``indecisive_top_k``); plus the FixMatch settings and quirks of the base class.
    """

    name = "proxyfl"
    trainer_class = ProxyFLTrainer

    def __init__(
        self,
        gpt: bool = True,
        icpl: bool = True,
        icpl_weight: float = 1.0,
        prior_momentum: float = 0.99,
        gpt_epochs: int = 100,
        gpt_batch_size: int = 4,
        gpt_lr: float = 0.005,
        gpt_margin_cap: float = 100.0,
        gpt_direction: str = "paper",
        gpt_margin: bool | None = None,
        indecisive_rule: str = "prior",
        indecisive_top_k: int = 5,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.gpt, self.icpl = check_flag("gpt", gpt), check_flag("icpl", icpl)
        self.icpl_weight = check_number("icpl_weight", icpl_weight, 0.0)
        self.prior_momentum = check_number("prior_momentum", prior_momentum, 0.0, 1.0)
        self.gpt_epochs = check_integer("gpt_epochs", gpt_epochs, 0)
        self.gpt_batch_size = check_integer("gpt_batch_size", gpt_batch_size, 1)
        self.gpt_lr = check_number("gpt_lr", gpt_lr, 0.0, low_open=True)
        self.gpt_margin_cap = check_number("gpt_margin_cap", gpt_margin_cap, 0.0)
        self.gpt_direction = check_choice("gpt_direction", gpt_direction, GPT_DIRECTIONS)
        if gpt_margin is not None:
            check_flag(
                "gpt_margin", gpt_margin, hint="δ on the true class; default: only with the code's direction"
            )
        #: δ is the code's (FSSLlib's ``update_GPT``); the paper's formula has no margin.
        self.gpt_margin = (self.gpt_direction == "code") if gpt_margin is None else gpt_margin
        self.indecisive_rule = check_choice("indecisive_rule", indecisive_rule, INDECISIVE_RULES)
        self.indecisive_top_k = check_integer("indecisive_top_k", indecisive_top_k, 1)
        self.prior: Tensor | None = None

    def config_defaults(self) -> dict[str, Any]:
        """ICPL needs the projection heads of resnet8 (the paper's model)."""
        return {**super().config_defaults(), **({"model.name": "resnet8"} if self.icpl else {})}

    def setup(self, info: FederationInfo) -> None:
        """Start the prior uniform, 1/C; check the model has the projection heads ICPL needs."""
        super().setup(info)
        if self.icpl:
            _require_proxy_heads(info.model)
        self.prior = torch.full((info.num_classes,), 1.0 / info.num_classes, dtype=torch.float64)

    def client_config(self, rnd: int) -> dict[str, ConfigValue]:
        return {
            **super().client_config(rnd),
            "proxyfl.icpl": self.icpl,
            "proxyfl.icpl_weight": self.icpl_weight,
            "proxyfl.indecisive_rule": self.indecisive_rule,
            "proxyfl.indecisive_top_k": self.indecisive_top_k,
        }

    def client_payload(self, rnd: int) -> dict[str, Tensor]:
        """The prior of the previous round, P_G' (methods.md §2.6 step 3)."""
        return {PRIOR_KEY: self.prior.float()}

    def after_aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        """After FedAvg: GPT on the classifier, then the prior EMA from the uploaded class counts."""
        record = self.round_record
        if replies and self.gpt and self.gpt_epochs > 0:
            head = self.model.head
            key = f"{getattr(self.model, 'head_prefix', 'head')}.weight"
            local = torch.stack([replies[c].weights[key].to(head.weight.device) for c in sorted(replies)])
            result = global_proxy_tuning(
                head.weight.detach(),
                local,
                epochs=self.gpt_epochs,
                batch_size=self.gpt_batch_size,
                lr=self.gpt_lr,
                margin_cap=self.gpt_margin_cap,
                direction=self.gpt_direction,
                use_margin=self.gpt_margin,
                rng=self.info.rng,
            )
            with torch.no_grad():
                head.weight.copy_(result.proxies)
            record.update(
                gpt_margin=result.margin,
                gpt_loss_before=result.loss_before,
                gpt_loss_after=result.loss_after,
                gpt_steps=result.steps,
            )
        counts = self._class_counts(rnd, replies)
        if counts is not None:
            self.prior = update_class_prior(self.prior, counts, self.prior_momentum)
        record["global_prior"] = [float(v) for v in self.prior]

    def _class_counts(self, rnd: int, replies: Mapping[int, Reply]) -> Tensor | None:
        rows = []
        for cid in sorted(replies):
            counts = replies[cid].payload.get("class_counts")
            ok = (
                isinstance(counts, Tensor)
                and counts.shape == self.prior.shape
                and bool(torch.isfinite(counts).all())
                and bool((counts >= 0).all())
            )
            if not ok:
                log.warning(
                    "round %d: client %d sent no valid class_counts (a non-negative finite tensor of shape "
                    "%s); its counts are left out of the prior",
                    rnd,
                    cid,
                    tuple(self.prior.shape),
                )
                continue
            rows.append(counts.double().cpu())
        return torch.stack(rows) if rows else None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "proxyfl_prior": self.prior.clone()}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        super().load_state_dict(sd)
        self.prior = torch.as_tensor(sd["proxyfl_prior"], dtype=torch.float64).clone()
