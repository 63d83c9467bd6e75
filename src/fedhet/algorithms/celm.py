"""CELM: data-free client contribution estimation by class-wise logit maximization (methods.md §1.1).

During warm-up (rounds t ≤ T_w = ⌈warmup_fraction · T⌉) the server sends only the global backbone; every
client keeps its own classification head. After each warm-up round the server probes every client model
w_i and the previous global model w_g: for each class c it runs Adam gradient ascent on the input,
maximising s_c(x; w) − λ‖x‖², from Gaussian noise. The final logits are the raw evidence q̃ (N × K). Then

    b = mean_c s_c(x*_{g,c}; w_g^{t−1})             (baseline; per class b_c with ``per_class_baseline``)
    q_{i,c} = max(0, q̃_{i,c} − b)                   (de-biased evidence)
    r_{i,c} = q_{i,c} / (Σ_j q_{j,c} + ε)             (per-class share)
    ĉ_i = (1/K) Σ_c r_{i,c},  c̄ = ĉ / Σ_j ĉ_j        (simplex; uniform if every ĉ is 0)
    c^t = β c^{t−1} + (1 − β) c̄,  c^0 = 1/N           (EMA, β = ema_momentum = 0.5)
    w_g^t = Σ_i c_i^t w_i^t                           (convex combination instead of n_i / n)

After warm-up c is frozen at c^{T_w}, the full model is sent and aggregated with c: FedAvg's cost.

[ours] design choices (the paper leaves them open; each is documented in docs/celm.md):
- A client's first head is the global head of the round it first trains in (the shared initial model's in
  round 1); during warm-up heads are aggregated with c as well, and the global head is used only for the
  baseline probe, for newcomers and for evaluation.
- Probe defaults: 200 Adam steps, lr 0.05, λ = 1e-3, init N(0, 1) in normalized input space, no clamping;
  the probe noise comes from a generator derived from (seed, round), so runs are bit-reproducible.
- ``evidence_scale='median'`` (off by default): each model's evidence divided by its own median logit, so
  a hostile random or scaled model cannot capture the weights (docs/robustness.md).
- ``evidence_clip=k`` (1 by default; 0, off, is the paper): before probing, each client's update is scaled
  down to at most k × the round's median update norm, so a longer update buys no evidence: the adaptive-scale
  attacker no longer holds the largest weight (docs/robustness.md). The paper reproductions set 0.
- Clients missing in a warm-up round keep their previous weight; the present clients share the mass they
  held before, c_i^t = β c_i^{t−1} + (1 − β) c̄_i · Σ_{j present} c_j^{t−1}, so c stays on the simplex;
  aggregation renormalises c over the clients present in the round.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.algorithms.fedavg import FedAvg
from fedhet.algorithms.fedrs import FedRSTrainer, RestrictedSoftmaxMixin
from fedhet.algorithms.logit_probes import PROBE_IMPLS, maximize_class_logits
from fedhet.algorithms.params import check_choice, check_flag, check_integer, check_number
from fedhet.engine.protocol import KEEP_KEY, FederationInfo, Instruction, Reply
from fedhet.errors import ConfigError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

log = logging.getLogger("fedhet")

INITIAL_CONTRIBUTIONS = ("uniform", "first")
EVIDENCE_SCALES = ("off", "median")
PROBE_BACKBONES = ("client", "global")
#: Stream id of the probe noise, apart from the engine's seed purposes (fedhet.engine.seeds.PURPOSE).
PROBE_STREAM = 0xCE1


# --------------------------------------------------------------------------------------------------------
# Contribution math: pure functions of the evidence matrix (methods.md §1.1 steps 3-7)
# --------------------------------------------------------------------------------------------------------
def warmup_rounds(warmup_fraction: float, rounds: int) -> int:
    """T_w = ⌈warmup_fraction · T⌉ (methods.md §1.1); at most T."""
    # The small tolerance keeps 0.05 · 100 = 5.000000000000001 from becoming 6.
    return min(rounds, math.ceil(warmup_fraction * rounds - 1e-9))


def rescale_evidence(evidence: np.ndarray, how: str = "off") -> np.ndarray:
    """[ours] ``how='median'``: each model's maximised logits (a row of the (M, K) evidence) divided by their
    median over classes, |median| floored at 1e-8, so that only class-specific evidence remains. A random or
    scaled model has large logits for every class (the faithful estimate hands it most of the weight);
    divided by its own scale its row is flat, near the baseline, and debiases to ~0. ``'off'``: unchanged."""
    e = np.asarray(evidence, dtype=np.float64)
    if how == "off":
        return e.copy()
    scale = np.maximum(np.abs(np.median(e, axis=1, keepdims=True)), 1e-8)
    return e / scale


def clip_to_median(
    states: Sequence[Mapping[str, Tensor]], references: Sequence[Mapping[str, Tensor]], factor: float
) -> tuple[list[dict[str, Tensor]], list[float]]:
    """[ours] Each model with its update Δ_i = w_i − ref_i (over the floating-point tensors ``ref_i`` holds)
    scaled down to at most ``factor`` × the median ‖Δ‖₂ over the models: w_i ← ref_i + s_i Δ_i,
    s_i = min(1, factor · median / ‖Δ_i‖). Returns the models (an unscaled one is the same object) and each
    s_i. The logits CELM maximises grow with the update's length (roughly with its square in a two-layer
    model: both layers move), so without this a client that lengthens its update reads as more evidence."""
    norms = []
    for state, ref in zip(states, references, strict=True):
        total = 0.0
        for key, base in ref.items():
            if base.is_floating_point():
                total += float((state[key].double() - base.to(state[key].device).double()).pow(2).sum())
        norms.append(math.sqrt(total))
    bound = factor * float(np.median(norms)) if norms else 0.0
    out, scales = [], []
    for state, ref, norm in zip(states, references, norms, strict=True):
        if norm <= bound or bound <= 0.0:
            out.append(state)  # type: ignore[arg-type]
            scales.append(1.0)
            continue
        scale = bound / norm
        clipped = dict(state)
        for key, base in ref.items():
            if base.is_floating_point():
                b = base.to(state[key].device).double()
                clipped[key] = (b + scale * (state[key].double() - b)).to(state[key].dtype)
        out.append(clipped)
        scales.append(scale)
    return out, scales


def baseline_from_global(global_logits: np.ndarray, per_class: bool = False) -> float | np.ndarray:
    """b = mean_c s_c(x*_{g,c}; w_g) (scalar, the paper), or the per-class vector b_c = s_c(x*_{g,c}; w_g)."""
    g = np.asarray(global_logits, dtype=np.float64)
    return g.copy() if per_class else float(g.mean())


def debias(raw: np.ndarray, baseline: float | np.ndarray) -> np.ndarray:
    """q = max(0, q̃ − b), elementwise on the (N, K) raw evidence; ``baseline`` a scalar or a (K,) vector."""
    return np.maximum(0.0, np.asarray(raw, dtype=np.float64) - np.asarray(baseline, dtype=np.float64))


def class_shares(evidence: np.ndarray, epsilon: float = 1e-8) -> np.ndarray:
    """r_{i,c} = q_{i,c} / (Σ_j q_{j,c} + ε): each client's share of each class's evidence (ε = 1e-8)."""
    q = np.asarray(evidence, dtype=np.float64)
    return q / (q.sum(axis=0, keepdims=True) + epsilon)


def client_scores(shares: np.ndarray) -> np.ndarray:
    """ĉ_i = (1/K) Σ_c r_{i,c}: the mean share over classes."""
    return np.asarray(shares, dtype=np.float64).mean(axis=1)


def to_simplex(scores: np.ndarray) -> np.ndarray:
    """c̄ = ĉ / Σ_j ĉ_j; uniform when every score is zero (no client shows any evidence)."""
    s = np.asarray(scores, dtype=np.float64)
    total = float(s.sum())
    if s.size == 0:
        return s.copy()
    if total <= 0.0:
        return np.full(s.shape, 1.0 / s.size)
    return s / total


def ema_contributions(
    previous: np.ndarray, current: np.ndarray, present: Sequence[int], momentum: float = 0.5
) -> np.ndarray:
    """c^t = β c^{t−1} + (1 − β) c̄ over all N clients.

    ``current`` is c̄ over the ``present`` clients only (a simplex over them). [ours] Absent clients keep
    c_i^{t−1}; c̄ is scaled to the mass Σ_{j present} c_j^{t−1} the present clients held, so c stays on
    the simplex (with every client present this is the paper's formula).
    """
    prev = np.asarray(previous, dtype=np.float64)
    cur = np.asarray(current, dtype=np.float64)
    idx = np.asarray(list(present), dtype=np.int64)
    if cur.shape != idx.shape:
        raise ValueError(
            f"current has {cur.size} entries for {idx.size} present clients; give one per client"
        )
    out = prev.copy()
    mass = float(prev[idx].sum()) if idx.size else 0.0
    out[idx] = momentum * prev[idx] + (1.0 - momentum) * cur * mass
    return out


@dataclass
class ContributionStep:
    """One warm-up round of the estimate: every intermediate of methods.md §1.1 steps 3-7."""

    baseline: float | np.ndarray  #: b (scalar) or b_c (K,)
    debiased: np.ndarray  #: q (P, K) for the present clients
    shares: np.ndarray  #: r (P, K)
    scores: np.ndarray  #: c̄ (P,), a simplex over the present clients
    contributions: np.ndarray  #: c^t (N,)


def estimate_contributions(
    previous: np.ndarray,
    raw: np.ndarray,
    global_logits: np.ndarray,
    present: Sequence[int],
    *,
    momentum: float = 0.5,
    epsilon: float = 1e-8,
    per_class_baseline: bool = False,
) -> ContributionStep:
    """One CELM estimation round from the raw evidence q̃ (P, K) of the present clients (client-id order)
    and the previous global model's maximised logits (K,): baseline, debias, shares, simplex, EMA."""
    raw = np.asarray(raw, dtype=np.float64)
    if raw.ndim != 2 or raw.shape[0] != len(present):
        raise ValueError(
            f"raw evidence has shape {raw.shape}; expected ({len(present)}, K), one row per client"
        )
    b = baseline_from_global(global_logits, per_class_baseline)
    q = debias(raw, b)
    r = class_shares(q, epsilon)
    c_bar = to_simplex(client_scores(r))
    c = ema_contributions(previous, c_bar, present, momentum)
    return ContributionStep(baseline=b, debiased=q, shares=r, scores=c_bar, contributions=c)


# --------------------------------------------------------------------------------------------------------
# Probes: class-wise logit maximization (methods.md §1.1 step 2)
# --------------------------------------------------------------------------------------------------------
def probe_generator(seed: int, rnd: int, stream: int = PROBE_STREAM) -> torch.Generator:
    """The probe-noise generator of round ``rnd``: a function of (seed, stream, round) only, so resume is
    exact; ``stream`` keeps independent uses of probe noise apart."""
    state = np.random.SeedSequence([seed, stream, rnd]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class EvidenceContributions:
    """CELM's contribution estimate as a component (methods.md §1.1 steps 2-7): probe the previous global
    model and the clients' models, debias, share per class, project to the simplex, EMA over rounds.

    Holds c (N,) and every round's evidence record. CELM drives it during its warm-up; data-free FedRAC
    (``contributions = "celm"``, docs/data-free-fairness.md) during its own.
    """

    def __init__(
        self,
        *,
        ema_momentum: float = 0.5,
        probe_steps: int = 200,
        probe_lr: float = 0.05,
        probe_l2: float = 1e-3,
        probe_init_scale: float = 1.0,
        probe_impl: str = "batched",
        per_class_baseline: bool = False,
        initial_contributions: str = "uniform",
        epsilon: float = 1e-8,
        evidence_scale: str = "off",
    ) -> None:
        self.ema_momentum = check_number(
            "ema_momentum", ema_momentum, 0.0, 1.0, hint="β of the EMA, the paper uses 0.5"
        )
        self.probe_steps = check_integer("probe_steps", probe_steps, 1, hint="default 200")
        self.probe_lr = check_number("probe_lr", probe_lr, 0.0, 1e6, low_open=True, hint="default 0.05")
        self.probe_l2 = check_number("probe_l2", probe_l2, 0.0, hint="λ, default 1e-3")
        self.probe_init_scale = check_number(
            "probe_init_scale", probe_init_scale, 0.0, low_open=True, hint="std of the start noise, 1.0"
        )
        self.probe_impl = check_choice("probe_impl", probe_impl, PROBE_IMPLS)
        self.per_class_baseline = check_flag("per_class_baseline", per_class_baseline)
        self.initial_contributions = check_choice(
            "initial_contributions",
            initial_contributions,
            INITIAL_CONTRIBUTIONS,
            hint="'uniform': c^0 = 1/N, 'first': c^1 = the first estimate",
        )
        self.epsilon = check_number("epsilon", epsilon, 0.0, hint="default 1e-8")
        self.evidence_scale = check_choice(
            "evidence_scale",
            evidence_scale,
            EVIDENCE_SCALES,
            hint="'off': the paper; 'median': each model's logits divided by their median over classes "
            "(robust to random or scaled models, docs/robustness.md)",
        )
        self.contribution = np.zeros(0)
        self.estimates = 0
        #: Per estimation round: raw evidence (N, K; NaN rows for absent clients), global logits, b, q, c̄.
        self.evidence: list[dict[str, Any]] = []

    def setup(self, info: FederationInfo) -> None:
        """c^0 = 1/N; the probes' model template, input shape, class count and seed come from ``info``."""
        self.info = info
        self.contribution = np.full(info.num_clients, 1.0 / info.num_clients)
        self.input_shape = tuple(int(s) for s in info.input_shape)

    def probe(self, states: Sequence[Mapping[str, Tensor]], rnd: int) -> Tensor:
        """Raw evidence (M, K) of the given model states with these probe settings and the round's seed."""
        return maximize_class_logits(
            self.info.model,
            states,
            self.input_shape,
            self.info.num_classes,
            steps=self.probe_steps,
            lr=self.probe_lr,
            l2=self.probe_l2,
            init_scale=self.probe_init_scale,
            generator=probe_generator(self.info.seed, rnd),
            impl=self.probe_impl,
        )

    def update(self, rnd: int, ids: list[int], states: Sequence[Mapping[str, Tensor]]) -> ContributionStep:
        """One estimation round: ``states`` are w_g^{t−1} first, then the clients ``ids`` (id order)."""
        evidence = rescale_evidence(self.probe(states, rnd).cpu().double().numpy(), self.evidence_scale)
        global_logits, raw = evidence[0], evidence[1:]
        momentum = self.ema_momentum
        if self.estimates == 0 and self.initial_contributions == "first":
            momentum = 0.0
        step = estimate_contributions(
            self.contribution,
            raw,
            global_logits,
            ids,
            momentum=momentum,
            epsilon=self.epsilon,
            per_class_baseline=self.per_class_baseline,
        )
        self.contribution = step.contributions
        self.estimates += 1
        n, k = self.info.num_clients, self.info.num_classes
        full_raw, full_q = np.full((n, k), np.nan), np.full((n, k), np.nan)
        full_raw[ids], full_q[ids] = raw, step.debiased
        scores = np.full(n, np.nan)
        scores[ids] = step.scores
        self.evidence.append(
            {
                "round": rnd,
                "raw": full_raw,
                "global": np.asarray(global_logits, dtype=np.float64),
                "baseline": np.broadcast_to(np.asarray(step.baseline, dtype=np.float64), (k,)).copy(),
                "debiased": full_q,
                "scores": scores,
            }
        )
        return step

    def state_dict(self) -> dict[str, Any]:
        return {
            "contribution": self.contribution.copy(),
            "estimates": self.estimates,
            "evidence": [dict(e) for e in self.evidence],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.contribution = np.asarray(state["contribution"], dtype=np.float64).copy()
        self.estimates = int(state["estimates"])
        self.evidence = [
            {k: (int(v) if k == "round" else np.asarray(v, dtype=np.float64).copy()) for k, v in e.items()}
            for e in state["evidence"]
        ]


def head_keeping_instructions(
    weights: Mapping[str, Tensor], backbone_keys: Sequence[str], with_heads: set[int], client_ids: list[int]
) -> dict[int, Instruction]:
    """CELM's warm-up message: the global backbone only, each client keeping its own head (a client without
    one yet gets the global head, the shared initial model's in round 1)."""
    backbone = {k: weights[k] for k in backbone_keys}
    return {
        cid: Instruction(weights=backbone if cid in with_heads else weights, config={KEEP_KEY: "head"})
        for cid in client_ids
    }


# --------------------------------------------------------------------------------------------------------
# The strategy
# --------------------------------------------------------------------------------------------------------
class CELM(FedAvg):
    """CELM (ECCV 2026): contribution weights from class-wise logit maximization during warm-up, frozen after.

    Parameters (all in ``[method] params``): ``warmup_fraction`` (T_w/T, 0.05), ``ema_momentum`` (β, 0.5),
    ``probe_steps`` (200), ``probe_lr`` (0.05), ``probe_l2`` (λ, 1e-3), ``probe_init_scale`` (1.0),
    ``probe_impl`` ('batched' | 'vmap' | 'loop'), ``per_class_baseline`` (False), ``initial_contributions``
    ('uniform' c^0 = 1/N | 'first' c^1 = c̄^1), ``epsilon`` (1e-8), ``probe_backbone`` ('client', the
    paper | 'global' [ours]: each client's head on the previous global backbone), ``evidence_scale``
    ('off', the paper | 'median' [ours]: robust to random or scaled models), ``evidence_clip`` (k ≥ 1, 1
    [ours]: each update probed at most k × the round's median update norm | 0, off, the paper),
    ``reward`` (as FedAvg).
    CELM uses no client sizes or class counts: only the models the clients send.
    """

    name = "celm"
    model_needs = frozenset({"head"})
    #: The estimate's parameters (``ema_momentum``, ``probe_*``, ...) are the estimator's own, declared once
    #: there; :func:`fedhet.algorithms.accepted_params` reads them from it.
    forwards_params_to = EvidenceContributions

    def __init__(
        self,
        warmup_fraction: float = 0.05,
        *,
        probe_backbone: str = "client",
        evidence_clip: float = 1.0,  # 0 until the robustness page (config_sections.CHANGED_METHOD_DEFAULTS)
        reward: str = "local",
        **estimator: Any,
    ) -> None:
        super().__init__(weighting="samples", reward=reward)
        self.warmup_fraction = check_number(
            "warmup_fraction", warmup_fraction, 0.0, 1.0, low_open=True, hint="the paper uses 0.05 (5% of T)"
        )
        self.estimator = EvidenceContributions(**estimator)
        self.probe_backbone = check_choice(
            "probe_backbone",
            probe_backbone,
            PROBE_BACKBONES,
            hint="'client': probe each client's own model, the paper; 'global': its head on the previous "
            "global backbone",
        )
        self.evidence_clip = check_number(
            "evidence_clip",
            evidence_clip,
            0.0,
            hint="0 (off, the paper) or a multiple k >= 1 of the round's median update norm that each update "
            "is scaled down to before probing (docs/robustness.md)",
        )
        if 0.0 < self.evidence_clip < 1.0:
            raise ConfigError(
                f"method.params.evidence_clip={evidence_clip!r} must be 0 (off) or >= 1: below 1 it scales "
                "down even the median client's update; use 1 to probe each update at most the median's length"
            )
        self.warmup = 0
        #: The head each client sent in its last warm-up reply: the start of its next update (its head is
        #: its own during warm-up); kept only with ``evidence_clip`` on.
        self.heads: dict[int, dict[str, Tensor]] = {}
        #: Clients that replied during warm-up, so hold a head of their own (the others get the global one).
        self.with_heads: set[int] = set()

    @property
    def contribution(self) -> np.ndarray:
        """c (N,), on the simplex (the estimator's)."""
        return self.estimator.contribution

    @property
    def evidence(self) -> list[dict[str, Any]]:
        """Every warm-up round's evidence record (the estimator's)."""
        return self.estimator.evidence

    @property
    def estimates(self) -> int:
        return self.estimator.estimates

    # -- life cycle ---------------------------------------------------------------------------------------
    def setup(self, info: FederationInfo) -> None:
        super().setup(info)  # the engine checked model_needs: a FedModel with a head
        self.warmup = warmup_rounds(self.warmup_fraction, info.rounds)
        self.estimator.setup(info)
        self.backbone_keys = list(info.model.backbone_keys())

    def in_warmup(self, rnd: int) -> bool:
        """Whether round ``rnd`` (1-based) is a warm-up round, t ≤ T_w."""
        return rnd <= self.warmup

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """Warm-up: the global backbone only, each client keeping its own head (a client without one yet
        gets the global head, the shared initial model's in round 1); afterwards the full model."""
        weights = self.global_weights()
        if not self.in_warmup(rnd):
            return {cid: Instruction(weights=weights) for cid in client_ids}
        return head_keeping_instructions(weights, self.backbone_keys, self.with_heads, client_ids)

    def aggregation_weights(self, rnd: int, replies: Mapping[int, Reply]) -> np.ndarray:
        """c_i for the replying clients, in client-id order (renormalised by ``weighted_average``)."""
        return self.contribution[sorted(replies)].copy()

    def all_zero_weights(self, rnd: int, ids: list[int]) -> np.ndarray:
        log.warning(
            "round %d: every replying client (%s) has contribution weight 0; averaging them uniformly",
            rnd,
            ids,
        )
        return super().all_zero_weights(rnd, ids)

    def before_aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        """In a warm-up round: probe the previous global model and every client model, update c."""
        if replies and self.in_warmup(rnd):
            ids = sorted(replies)
            states = self.probed_states(ids, replies)  # before with_heads grows: the updates' references
            self.with_heads.update(replies)
            if self.evidence_clip:
                head_keys = set(self.model.head_keys())
                for c in ids:
                    self.heads[c] = {
                        k: v.detach().clone() for k, v in replies[c].weights.items() if k in head_keys
                    }
            self.estimator.update(rnd, ids, states)

    def probe(self, states: Sequence[Mapping[str, Tensor]], rnd: int) -> Tensor:
        """Raw evidence (M, K) of the given model states with this run's probe settings and round seed."""
        return self.estimator.probe(states, rnd)

    def probed_states(self, ids: list[int], replies: Mapping[int, Reply]) -> list[Mapping[str, Tensor]]:
        """The models probed in a warm-up round: w_g^{t−1} first, then each client's (client-id order).

        ``probe_backbone='global'`` ([ours]) probes each client's head on the backbone of w_g^{t−1}.
        ``evidence_clip`` ([ours]) first scales each client's update down (:meth:`update_references`).
        """
        # Before aggregation self.model still holds w_g^{t-1} (the initial model at t = 1).
        global_state = self.model.state_dict()
        clients = [replies[c].weights for c in ids]
        if self.evidence_clip:
            references = self.update_references(ids, global_state)
            clients, scales = clip_to_median(clients, references, self.evidence_clip)
            scaled = {c: round(s, 4) for c, s in zip(ids, scales, strict=True) if s < 1.0}
            if scaled:
                log.info("CELM evidence_clip: probing these clients' updates scaled by %s", scaled)
        if self.probe_backbone == "global":
            shared = {k: global_state[k] for k in self.backbone_keys}
            clients = [{**w, **shared} for w in clients]
        return [global_state, *clients]

    def update_references(
        self, ids: list[int], global_state: Mapping[str, Tensor]
    ) -> list[dict[str, Tensor]]:
        """What each client's warm-up update starts from: the backbone it was sent (w_g^{t−1}'s) and, as the
        client keeps its head, the head it sent in its last warm-up reply (the global head for a client
        replying for the first time: it was sent the full model). So Δ_i is everything the client moved
        this round, the head included, which the guards do not see after round 1 (they judge what was sent).
        """
        out = []
        for c in ids:
            ref = dict(global_state)
            if c in self.with_heads and c in self.heads:
                ref.update(self.heads[c])
            out.append(ref)
        return out

    def contributions(self) -> np.ndarray | None:
        """The current contribution weights c (N,), on the simplex; frozen after warm-up."""
        return self.contribution.copy() if self.contribution.size else None

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        out = super().round_metrics(rnd)
        out["celm_phase"] = "warmup" if self.in_warmup(rnd) else "frozen"
        return out

    def after_aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        """At the end of warm-up, warn where its rounds got no replies (every client failed or was rejected)
        or a client never replied in one: its weight is then its starting 1/N, not an estimate. Logs only."""
        super().after_aggregate(rnd, replies)
        if rnd != self.warmup:
            return
        estimated = {int(e["round"]) for e in self.evidence}
        empty = [r for r in range(1, self.warmup + 1) if r not in estimated]
        n = self.info.num_clients
        silent = [c for c in range(n) if c not in self.with_heads]
        frozen = f"frozen from round {self.warmup + 1}" if self.warmup < self.info.rounds else "final"
        if len(empty) == self.warmup:
            log.warning(
                "CELM: no client replied in any warm-up round (rounds 1-%d): the contribution weights are "
                "their starting 1/%d each, not an estimate, and %s; see 'failed' and 'rejected' in "
                "metrics.jsonl for why",
                self.warmup,
                n,
                frozen,
            )
            return
        parts = []
        if empty:
            used = sorted(estimated)
            parts.append(
                f"warm-up round{'s' if len(empty) > 1 else ''} {', '.join(map(str, empty))} got no replies, "
                f"so the contribution weights ({frozen}) come from round{'s' if len(used) > 1 else ''} "
                f"{', '.join(map(str, used))} alone"
            )
        if silent:
            names = ", ".join(f"client {c}" for c in silent)
            whose = "its weight is its" if len(silent) == 1 else "their weights are their"
            parts.append(f"{names} replied in no warm-up round, so {whose} starting share, not an estimate")
        if parts:
            log.warning("CELM: %s; see 'failed' and 'rejected' in metrics.jsonl for why", "; ".join(parts))

    def run_records(self) -> dict[str, Any]:
        """The warm-up length and every warm-up round's evidence (the report's CSVs and heatmap)."""
        return {"celm": {"warmup_rounds": self.warmup, "evidence": self.evidence}}

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["celm"] = {**self.estimator.state_dict(), "with_heads": sorted(self.with_heads)}
        if self.evidence_clip:  # a run with the option off keeps its checkpoint layout
            sd["celm"]["heads"] = {str(c): dict(h) for c, h in self.heads.items()}
        return sd

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        super().load_state_dict(sd)
        state = sd["celm"]
        self.estimator.load_state_dict(state)
        self.with_heads = {int(c) for c in state["with_heads"]}
        self.heads = {int(c): dict(h) for c, h in state.get("heads", {}).items()}


class CELMRS(RestrictedSoftmaxMixin, CELM):
    """CELM(RS): CELM's server (contribution-weighted aggregation) with the FedRS client loss."""

    name = "celm-rs"
    trainer_class = FedRSTrainer
