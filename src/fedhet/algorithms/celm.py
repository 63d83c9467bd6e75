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
- Round-1 heads are the shared initial model's; during warm-up heads are aggregated with c as well, and the
  global head is used only for the baseline probe and for evaluation.
- Probe defaults: 200 Adam steps, lr 0.05, λ = 1e-3, init N(0, 1) in normalized input space, no clamping;
  the probe noise comes from a generator derived from (seed, round), so runs are bit-reproducible.
- Clients missing in a warm-up round keep their previous weight; the present clients share the mass they
  held before, c_i^t = β c_i^{t−1} + (1 − β) c̄_i · Σ_{j present} c_j^{t−1}, so c stays on the simplex;
  aggregation renormalises c over the clients present in the round.
"""

from __future__ import annotations

import copy
import csv
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedhet.algorithms.fedrs import RestrictedSoftmaxMixin
from fedhet.engine.protocol import Instruction, Reply, ServerContext, Strategy, weighted_average
from fedhet.errors import ConfigError
from fedhet.models.mlp import MLP

log = logging.getLogger("fedhet")

#: "batched": the fastest batched path for the model (closed-form input gradients for fedhet's MLP, vmap
#: otherwise); "vmap": the generic vmap path for any model; "loop": the per-(model, class) reference.
PROBE_IMPLS = ("batched", "vmap", "loop")
INITIAL_CONTRIBUTIONS = ("uniform", "first")
PROBE_BACKBONES = ("client", "global")
#: Stream id of the probe noise, apart from the engine's seed purposes (fedhet.engine.simulation.PURPOSE).
PROBE_STREAM = 0xCE1


# --------------------------------------------------------------------------------------------------------
# Contribution math: pure functions of the evidence matrix (methods.md §1.1 steps 3-7)
# --------------------------------------------------------------------------------------------------------
def warmup_rounds(warmup_fraction: float, rounds: int) -> int:
    """T_w = ⌈warmup_fraction · T⌉ (methods.md §1.1); at most T."""
    # The small tolerance keeps 0.05 · 100 = 5.000000000000001 from becoming 6.
    return min(rounds, math.ceil(warmup_fraction * rounds - 1e-9))


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
def probe_generator(seed: int, rnd: int) -> torch.Generator:
    """The probe-noise generator of round ``rnd``: a function of (seed, round) only, so resume is exact."""
    state = np.random.SeedSequence([seed, PROBE_STREAM, rnd]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def probe_noise(
    num_models: int,
    num_classes: int,
    input_shape: Sequence[int],
    init_scale: float,
    generator: torch.Generator,
) -> Tensor:
    """Start points x⁰ ~ N(0, init_scale²) of shape (M, K, *input_shape), drawn on the CPU."""
    return init_scale * torch.randn((num_models, num_classes, *input_shape), generator=generator)


def _ascent_gradient(grad: Tensor, x: Tensor, l2: float) -> Tensor:
    # ∇_x [s_c(x) − λ‖x‖²] = ∇_x s_c(x) − 2λx; the penalty's gradient is exact, not autograd's.
    return grad.sub_(x.detach(), alpha=2.0 * l2)


class AdamAscent:
    """Adam ascent on one tensor with ``torch.optim.Adam``'s defaults (β = 0.9/0.999, ε = 1e-8,
    ``maximize=True``), the same update in place without the optimizer's per-step bookkeeping.

    The probe runs hundreds of tiny steps, where ``torch.optim.Adam.step`` costs about a fifth of the time.
    """

    def __init__(self, x: Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.x, self.lr, self.betas, self.eps = x, lr, betas, eps
        self.exp_avg = torch.zeros_like(x)
        self.exp_avg_sq = torch.zeros_like(x)
        self.denom = torch.empty_like(x)
        self.t = 0

    @torch.no_grad()
    def step(self, grad: Tensor) -> None:
        """x ← x + lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε), with m, v the moment EMAs of ``grad``."""
        b1, b2 = self.betas
        self.t += 1
        self.exp_avg.lerp_(grad, 1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        torch.sqrt(self.exp_avg_sq, out=self.denom).div_(math.sqrt(1 - b2**self.t)).add_(self.eps)
        self.x.addcdiv_(self.exp_avg, self.denom, value=self.lr / (1 - b1**self.t))


def maximize_logits_batched(
    template: nn.Module,
    states: Sequence[Mapping[str, Tensor]],
    noise: Tensor,
    *,
    steps: int,
    lr: float,
    l2: float,
) -> Tensor:
    """All M models × K classes at once: vmap of ``functional_call`` over the stacked states; each model's
    K probes are one batch. Returns the final logits s_c(x*_{m,c}; w_m) as an (M, K) tensor."""
    meta = copy.deepcopy(template).to("meta").eval()
    device = next(iter(states[0].values())).device
    stacked = {k: torch.stack([s[k].detach().to(device) for s in states]) for k in states[0]}
    forward = vmap(lambda w, x: functional_call(meta, w, (x,)))
    num_classes = noise.shape[1]
    cls = torch.arange(num_classes, device=device)
    x = noise.to(device).clone().requires_grad_(True)
    opt = AdamAscent(x, lr)
    for _ in range(steps):
        logits = forward(stacked, x)  # (M, K inputs, K classes)
        (grad,) = torch.autograd.grad(logits[:, cls, cls].sum(), x)
        opt.step(_ascent_gradient(grad, x, l2))
    with torch.no_grad():
        return forward(stacked, x)[:, cls, cls].detach()


def stacked_mlp_layers(
    template: nn.Module, states: Sequence[Mapping[str, Tensor]]
) -> list[tuple[Tensor, Tensor]] | None:
    """(weights (M, out, in), biases (M, out)) of every Linear layer of fedhet's ``MLP``, hidden layers
    first and the head last, stacked over ``states``; None for any other model."""
    if type(template) is not MLP:
        return None
    names = [f"hidden.{i}" for i in range(len(template.hidden))] + ["head"]
    device = next(iter(states[0].values())).device
    return [
        tuple(
            torch.stack([s[f"{name}.{part}"].detach().to(device) for s in states])
            for part in ("weight", "bias")
        )
        for name in names
    ]


def maximize_logits_mlp(
    layers: list[tuple[Tensor, Tensor]], noise: Tensor, *, steps: int, lr: float, l2: float
) -> Tensor:
    """:func:`maximize_logits_batched` for the MLP without autograd: the input gradient in closed form,
    ∇_x s_c = W_1ᵀ D_1 W_2ᵀ D_2 ⋯ W_Lᵀ D_L w_c (D_l the ReLU derivatives, 1 where z_l > 0, as autograd's),
    so a step costs two batched products per layer and nothing else. Same start points and Adam."""
    *hidden, (head_w, head_b) = layers
    num_models, num_classes = noise.shape[:2]
    x = noise.reshape(num_models, num_classes, -1).to(head_w.device).clone()
    opt = AdamAscent(x, lr)

    def hidden_forward(h: Tensor) -> tuple[Tensor, list[Tensor]]:
        active = []
        for w, b in hidden:
            z = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
            active.append(z > 0)
            h = z.clamp_min_(0.0)
        return h, active

    for _ in range(steps):
        _, active = hidden_forward(x)
        grad = head_w  # (M, K, H): the probe of class c starts from the head's row w_c
        for (w, _), on in zip(reversed(hidden), reversed(active), strict=True):
            grad = torch.bmm(grad * on, w)
        opt.step(_ascent_gradient(grad, x, l2))
    h, _ = hidden_forward(x)
    logits = torch.baddbmm(head_b.unsqueeze(1), h, head_w.transpose(1, 2))  # (M, K probes, K classes)
    cls = torch.arange(num_classes, device=logits.device)
    return logits[:, cls, cls]


def maximize_logits_loop(
    template: nn.Module,
    states: Sequence[Mapping[str, Tensor]],
    noise: Tensor,
    *,
    steps: int,
    lr: float,
    l2: float,
) -> Tensor:
    """Reference implementation: one probe at a time, a Python loop over (model, class). Same maths,
    same start points and optimiser as :func:`maximize_logits_batched`."""
    model = copy.deepcopy(template).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    num_models, num_classes = noise.shape[:2]
    device = next(iter(states[0].values())).device
    out = torch.empty(num_models, num_classes, device=device)
    for m, state in enumerate(states):
        model.load_state_dict(state)
        for c in range(num_classes):
            x = noise[m, c : c + 1].to(device).clone().requires_grad_(True)
            opt = torch.optim.Adam([x], lr=lr, maximize=True)
            for _ in range(steps):
                (grad,) = torch.autograd.grad(model(x)[0, c], x)
                x.grad = _ascent_gradient(grad, x, l2)
                opt.step()
            with torch.no_grad():
                out[m, c] = model(x)[0, c]
    return out


def maximize_class_logits(
    template: nn.Module,
    states: Sequence[Mapping[str, Tensor]],
    input_shape: Sequence[int],
    num_classes: int,
    *,
    steps: int = 200,
    lr: float = 0.05,
    l2: float = 1e-3,
    init_scale: float = 1.0,
    generator: torch.Generator | None = None,
    impl: str = "batched",
) -> Tensor:
    """Raw evidence q̃_{m,c} = s_c(x*) after Adam ascent on s_c(x; w_m) − λ‖x‖² from N(0, init_scale²)
    noise, for every state m and class c (eval mode, no gradients into the weights). Returns (M, K)."""
    if impl not in PROBE_IMPLS:
        raise ConfigError(f"probe_impl={impl!r}; accepted: {list(PROBE_IMPLS)}")
    if not states:
        return torch.empty(0, num_classes)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    noise = probe_noise(len(states), num_classes, input_shape, init_scale, gen)
    if impl == "loop":
        return maximize_logits_loop(template, states, noise, steps=steps, lr=lr, l2=l2)
    layers = stacked_mlp_layers(template, states) if impl == "batched" else None
    if layers is not None:
        return maximize_logits_mlp(layers, noise, steps=steps, lr=lr, l2=l2)
    return maximize_logits_batched(template, states, noise, steps=steps, lr=lr, l2=l2)


# --------------------------------------------------------------------------------------------------------
# The strategy
# --------------------------------------------------------------------------------------------------------
def _check_number(
    name: str, value: Any, low: float, high: float | None, *, low_open: bool, hint: str
) -> float:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        bracket = "(" if low_open else "["
        upper = f"{high}]" if high is not None else "inf)"
        raise ConfigError(
            f"method.params.{name}={value!r} must be a number in {bracket}{low}, {upper}; {hint}"
        )
    return float(value)


class CELM(Strategy):
    """CELM (ECCV 2026): contribution weights from class-wise logit maximization during warm-up, frozen after.

    Parameters (all in ``[method] params``): ``warmup_fraction`` (T_w/T, 0.05), ``ema_momentum`` (β, 0.5),
    ``probe_steps`` (200), ``probe_lr`` (0.05), ``probe_l2`` (λ, 1e-3), ``probe_init_scale`` (1.0),
    ``probe_impl`` ('batched' | 'loop'), ``per_class_baseline`` (False), ``initial_contributions``
    ('uniform' c^0 = 1/N | 'first' c^1 = c̄^1), ``epsilon`` (1e-8), ``probe_backbone`` ('client', the
    paper | 'global' [ours]: each client's head on the previous global backbone), ``reward`` (as FedAvg).
    """

    name = "celm"
    keeps_client_models = True

    def __init__(
        self,
        warmup_fraction: float = 0.05,
        ema_momentum: float = 0.5,
        probe_steps: int = 200,
        probe_lr: float = 0.05,
        probe_l2: float = 1e-3,
        probe_init_scale: float = 1.0,
        probe_impl: str = "batched",
        per_class_baseline: bool = False,
        initial_contributions: str = "uniform",
        epsilon: float = 1e-8,
        probe_backbone: str = "client",
        reward: str = "local",
    ) -> None:
        super().__init__(weighting="samples", reward=reward)
        self.warmup_fraction = _check_number(
            "warmup_fraction", warmup_fraction, 0.0, 1.0, low_open=True, hint="the paper uses 0.05 (5% of T)"
        )
        self.ema_momentum = _check_number(
            "ema_momentum", ema_momentum, 0.0, 1.0, low_open=False, hint="β of the EMA, the paper uses 0.5"
        )
        if isinstance(probe_steps, bool) or not isinstance(probe_steps, int) or probe_steps < 1:
            raise ConfigError(
                f"method.params.probe_steps={probe_steps!r} must be an integer >= 1 (default 200)"
            )
        self.probe_steps = probe_steps
        self.probe_lr = _check_number("probe_lr", probe_lr, 0.0, None, low_open=True, hint="default 0.05")
        self.probe_l2 = _check_number("probe_l2", probe_l2, 0.0, None, low_open=False, hint="λ, default 1e-3")
        self.probe_init_scale = _check_number(
            "probe_init_scale", probe_init_scale, 0.0, None, low_open=True, hint="std of the start noise, 1.0"
        )
        if probe_impl not in PROBE_IMPLS:
            raise ConfigError(f"method.params.probe_impl={probe_impl!r}; accepted: {list(PROBE_IMPLS)}")
        self.probe_impl = probe_impl
        if not isinstance(per_class_baseline, bool):
            raise ConfigError(
                f"method.params.per_class_baseline={per_class_baseline!r} must be true or false"
            )
        self.per_class_baseline = per_class_baseline
        if initial_contributions not in INITIAL_CONTRIBUTIONS:
            raise ConfigError(
                f"method.params.initial_contributions={initial_contributions!r}; accepted: "
                f"{list(INITIAL_CONTRIBUTIONS)} ('uniform': c^0 = 1/N, 'first': c^1 = the first estimate)"
            )
        self.initial_contributions = initial_contributions
        self.epsilon = _check_number("epsilon", epsilon, 0.0, None, low_open=False, hint="default 1e-8")
        if probe_backbone not in PROBE_BACKBONES:
            raise ConfigError(
                f"method.params.probe_backbone={probe_backbone!r}; accepted: {list(PROBE_BACKBONES)} "
                "('client': probe each client's own model, the paper; 'global': its head on the previous "
                "global backbone)"
            )
        self.probe_backbone = probe_backbone
        self.warmup = 0
        self.contribution = np.zeros(0)
        self.estimates = 0
        #: (round, c^t) after every round with replies (frozen rows after warm-up).
        self.history: list[tuple[int, list[float]]] = []
        #: Per warm-up round: raw evidence (N, K; NaN rows for absent clients), global logits, baseline, q, c̄.
        self.evidence: list[dict[str, Any]] = []

    # -- life cycle ---------------------------------------------------------------------------------------
    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        if not hasattr(ctx.model, "backbone_keys"):
            raise ConfigError(
                f"CELM needs a model with a backbone and a head (a fedhet FedModel), "
                f"got {type(ctx.model).__name__}"
            )
        self.warmup = warmup_rounds(self.warmup_fraction, ctx.rounds)
        self.contribution = np.full(ctx.num_clients, 1.0 / ctx.num_clients)
        self.backbone_keys = list(ctx.model.backbone_keys())
        shape = ctx.input_shape
        if shape is None and ctx.validation is not None:
            shape = tuple(ctx.validation[0].shape[1:])
        if shape is None:
            raise ConfigError(
                "CELM needs the input shape for its probes: ServerContext.input_shape is not set"
            )
        self.input_shape = tuple(int(s) for s in shape)

    def in_warmup(self, rnd: int) -> bool:
        """Whether round ``rnd`` (1-based) is a warm-up round, t ≤ T_w."""
        return rnd <= self.warmup

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """Warm-up: the global backbone only (each client keeps its own head); afterwards the full model."""
        weights = self.global_weights()
        if self.in_warmup(rnd):
            weights = {k: weights[k] for k in self.backbone_keys}
        return {cid: Instruction(weights=weights) for cid in client_ids}

    def aggregation_weights(self, rnd: int, replies: dict[int, Reply]) -> np.ndarray:
        """c_i for the replying clients, in client-id order (renormalised by ``weighted_average``)."""
        return self.contribution[sorted(replies)].copy()

    def aggregate(self, rnd: int, replies: dict[int, Reply]) -> None:
        """Warm-up: probe, update c, then average with c; afterwards average with the frozen c."""
        if self.track_local_models:
            for cid, rep in replies.items():
                self.local_weights[cid] = rep.weights
        if not replies:
            return
        ids = sorted(replies)
        if self.in_warmup(rnd):
            self._estimate(rnd, ids, replies)
        p = self.aggregation_weights(rnd, replies)
        if float(p.sum()) <= 0.0:
            log.warning(
                "round %d: every replying client (%s) has contribution weight 0; averaging them uniformly",
                rnd,
                ids,
            )
            p = np.ones(len(ids))
        self.model.load_state_dict(weighted_average([replies[c].weights for c in ids], p))
        self.history.append((rnd, [float(v) for v in self.contribution]))

    def probe(self, states: Sequence[Mapping[str, Tensor]], rnd: int) -> Tensor:
        """Raw evidence (M, K) of the given model states with this run's probe settings and round seed."""
        return maximize_class_logits(
            self.model,
            states,
            self.input_shape,
            self.ctx.num_classes,
            steps=self.probe_steps,
            lr=self.probe_lr,
            l2=self.probe_l2,
            init_scale=self.probe_init_scale,
            generator=probe_generator(self.ctx.seed, rnd),
            impl=self.probe_impl,
        )

    def probed_states(self, ids: list[int], replies: dict[int, Reply]) -> list[Mapping[str, Tensor]]:
        """The models probed in a warm-up round: w_g^{t−1} first, then each client's (client-id order).

        ``probe_backbone='global'`` ([ours]) probes each client's head on the backbone of w_g^{t−1}.
        """
        # self.model still holds w_g^{t-1} (the initial model at t = 1) when aggregate() probes.
        global_state = self.model.state_dict()
        clients = [replies[c].weights for c in ids]
        if self.probe_backbone == "global":
            shared = {k: global_state[k] for k in self.backbone_keys}
            clients = [{**w, **shared} for w in clients]
        return [global_state, *clients]

    def _estimate(self, rnd: int, ids: list[int], replies: dict[int, Reply]) -> None:
        states = self.probed_states(ids, replies)
        evidence = self.probe(states, rnd).cpu().double().numpy()
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
        n, k = self.ctx.num_clients, self.ctx.num_classes
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

    def contributions(self) -> np.ndarray | None:
        """The current contribution weights c (N,), on the simplex; frozen after warm-up."""
        return self.contribution.copy() if self.contribution.size else None

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        out = super().round_metrics(rnd)
        out["celm_phase"] = "warmup" if self.in_warmup(rnd) else "frozen"
        return out

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["celm"] = {
            "contribution": self.contribution.copy(),
            "estimates": self.estimates,
            "history": [[r, list(c)] for r, c in self.history],
            "evidence": [dict(e) for e in self.evidence],
        }
        return sd

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        super().load_state_dict(sd)
        state = sd["celm"]
        self.contribution = np.asarray(state["contribution"], dtype=np.float64).copy()
        self.estimates = int(state["estimates"])
        self.history = [(int(r), [float(v) for v in c]) for r, c in state["history"]]
        self.evidence = [
            {k: (int(v) if k == "round" else np.asarray(v, dtype=np.float64).copy()) for k, v in e.items()}
            for e in state["evidence"]
        ]

    # -- artifacts --------------------------------------------------------------------------------------
    def roles(self) -> dict[str, list[int]]:
        """Clients with a known role in the split (partition info): ``free_rider`` and ``maverick``."""
        info = self.ctx.info if self.ctx is not None else {}
        free = info.get("free_rider")
        return {
            "free_rider": [int(free)] if free is not None else [],
            "maverick": [int(c) for c in info.get("maverick_clients", [])],
        }

    def write_artifacts(self, run_dir: Any) -> None:
        """contributions.csv, evidence/round_NNN_{raw,debiased}.csv and three figures under figures/."""
        run = Path(run_dir)
        n, k = self.ctx.num_clients, self.ctx.num_classes
        with open(run / "contributions.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["round", "phase"] + [f"client_{i}" for i in range(n)])
            for rnd, c in self.history:
                w.writerow([rnd, "warmup" if self.in_warmup(rnd) else "frozen"] + [f"{v:.10g}" for v in c])
        ev_dir = run / "evidence"
        ev_dir.mkdir(exist_ok=True)
        header = ["model"] + [f"class_{c}" for c in range(k)]
        for e in self.evidence:
            t = e["round"]
            with open(ev_dir / f"round_{t:03d}_raw.csv", "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(header)
                w.writerow(["global_previous"] + [f"{v:.8g}" for v in e["global"]])
                for i in range(n):
                    w.writerow([f"client_{i}"] + _cells(e["raw"][i]))
            with open(ev_dir / f"round_{t:03d}_debiased.csv", "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(header + ["score"])
                w.writerow(["baseline"] + [f"{v:.8g}" for v in e["baseline"]] + [""])
                for i in range(n):
                    w.writerow([f"client_{i}"] + _cells(e["debiased"][i]) + _cells(e["scores"][i : i + 1]))
        write_figures(self, run / "figures")


def _cells(values: np.ndarray) -> list[str]:
    return ["" if not np.isfinite(v) else f"{v:.8g}" for v in values]


# --------------------------------------------------------------------------------------------------------
# Figures (matplotlib Agg; ``fedhet report`` embeds every PNG under the run's figures/)
# --------------------------------------------------------------------------------------------------------
ROLE_COLORS = {"free_rider": "tab:red", "maverick": "tab:orange", "other": "tab:blue"}


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _role_of(cid: int, roles: Mapping[str, list[int]]) -> str:
    for role in ("free_rider", "maverick"):
        if cid in roles.get(role, []):
            return role
    return "other"


def plot_contribution_history(
    history: Sequence[tuple[int, Sequence[float]]], warmup: int, roles: Mapping[str, list[int]], path: Path
) -> bool:
    """Contribution weights c_i^t over rounds (warm-up shaded; free riders and mavericks coloured)."""
    if not history:
        return False
    rounds = np.array([r for r, _ in history])
    c = np.array([v for _, v in history])
    n = c.shape[1]
    fig = _figure(7.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    if warmup:
        ax.axvspan(0.5, warmup + 0.5, color="0.9", label=f"warm-up (T_w = {warmup})")
    for i in range(n):
        role = _role_of(i, roles)
        style = {"color": ROLE_COLORS[role], "lw": 2.0} if role != "other" else {"lw": 1.0, "alpha": 0.7}
        label = f"client {i}" + ("" if role == "other" else f" ({role.replace('_', '-')})")
        ax.plot(rounds, c[:, i], marker="o" if len(rounds) <= 30 else None, ms=3, label=label, **style)
    ax.axhline(1.0 / n, color="k", ls="--", lw=0.8, label="1/N")
    ax.set_xlabel("round")
    ax.set_ylabel("contribution weight c_i")
    ax.set_title("CELM contribution weights over rounds")
    ax.legend(fontsize=7, ncol=2 if n > 6 else 1, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return True


def plot_evidence_heatmap(record: Mapping[str, Any], roles: Mapping[str, list[int]], path: Path) -> bool:
    """Client × class heatmaps of one warm-up round: raw q̃ (and the global row), q = max(0, q̃ − b)."""
    raw, q = np.asarray(record["raw"]), np.asarray(record["debiased"])
    n, k = raw.shape
    labels = [
        f"{i}" + {"free_rider": " FR", "maverick": " MV", "other": ""}[_role_of(i, roles)] for i in range(n)
    ]
    fig = _figure(min(4.0 + 1.0 * k, 26.0), min(2.5 + 0.35 * (n + 1), 20.0))
    panels = (
        (
            np.vstack([np.asarray(record["global"])[None], raw]),
            ["global"] + labels,
            "raw evidence q̃ (max logit)",
        ),
        (q, labels, f"de-biased q = max(0, q̃ − b), b = {_fmt_baseline(record['baseline'])}"),
    )
    for j, (mat, ylabels, title) in enumerate(panels):
        ax = fig.add_subplot(1, 2, j + 1)
        image = ax.imshow(np.ma.masked_invalid(mat), aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(image, ax=ax)
        ax.set_xticks(range(k))
        ax.set_xlabel("class")
        ax.set_yticks(range(len(ylabels)))
        ax.set_yticklabels(ylabels, fontsize=7)
        ax.set_title(title, fontsize=8)
        if mat.size <= 400:
            top = np.nanmax(mat) if np.isfinite(mat).any() else 0.0
            for (r, col), v in np.ndenumerate(mat):
                if np.isfinite(v):
                    color = "black" if top > 0 and v > 0.6 * top else "white"
                    ax.text(
                        col,
                        r,
                        f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}",
                        ha="center",
                        va="center",
                        fontsize=6,
                        color=color,
                    )
    fig.suptitle(f"CELM evidence, round {record['round']} (FR = free rider, MV = maverick)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return True


def _fmt_baseline(baseline: np.ndarray) -> str:
    b = np.asarray(baseline)
    return f"{float(b.flat[0]):.2f}" if b.size and np.allclose(b, b.flat[0]) else "b_c per class"


def plot_final_weights(contribution: np.ndarray, roles: Mapping[str, list[int]], path: Path) -> bool:
    """Bar chart of the final (frozen) weights with 1/N (FedAvg's equal share); roles coloured."""
    c = np.asarray(contribution)
    if c.size == 0:
        return False
    n = c.size
    fig = _figure(max(4.0, 0.6 * n + 2.0), 3.5)
    ax = fig.add_subplot(1, 1, 1)
    colors = [ROLE_COLORS[_role_of(i, roles)] for i in range(n)]
    ax.bar(range(n), c, color=colors)
    ax.axhline(1.0 / n, color="k", ls="--", lw=0.8)
    ax.set_xticks(range(n))
    ax.set_xlabel("client")
    ax.set_ylabel("final weight c_i")
    from matplotlib.patches import Patch

    handles = [
        Patch(color=ROLE_COLORS[r], label=r.replace("_", "-"))
        for r in ("free_rider", "maverick")
        if roles.get(r)
    ]
    handles.append(Patch(color=ROLE_COLORS["other"], label="other"))
    from matplotlib.lines import Line2D

    handles.append(Line2D([0], [0], color="k", ls="--", lw=0.8, label="1/N"))
    ax.legend(handles=handles, fontsize=7)
    ax.set_title("CELM final contribution weights")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return True


def write_figures(strategy: CELM, fig_dir: Path) -> None:
    """The three CELM figures of a run: weights over rounds, the last warm-up evidence, final weights."""
    roles = strategy.roles()
    plot_contribution_history(strategy.history, strategy.warmup, roles, fig_dir / "celm_contributions.png")
    if strategy.evidence:
        plot_evidence_heatmap(strategy.evidence[-1], roles, fig_dir / "celm_evidence.png")
    plot_final_weights(strategy.contribution, roles, fig_dir / "celm_final_weights.png")


class CELMRS(RestrictedSoftmaxMixin, CELM):
    """CELM(RS): CELM's server (contribution-weighted aggregation) with the FedRS client loss."""

    name = "celm-rs"
