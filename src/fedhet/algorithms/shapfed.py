"""ShapFed — Tastan et al., "Redefining Contributions: Shapley-Driven Federated Learning", IJCAI 2024
(baselines.md §2.4; verified against ``tnurbek/shapfed`` ``main_cifar10.py``, ``main_synthetic.py``).

Each client trains its own (personalised) model. From the last linear layer — fedhet's ``head``
(``FedModel.head_keys()``) — the server forms class-wise "gradients" g_{i,c} = (w_init − w_final)/lr: row c of
the head's weight concatenated with bias c (the 1/lr factor cancels in every cosine and is dropped). The
aggregate G_c(S) = Σ_{j∈S} p_j g_{j,c} / Σ_{j∈S} p_j uses the current normalised weights p.

Class-wise contribution s_{i,c} (``contribution``):

- ``'grand-coalition'`` (default; the released code, used for CELM's table): s_{i,c} = cos(g_{i,c}, G_c(all));
  the code loops over ``combinations(range(n), n)``, which has exactly one element.
- ``'exact-shapley'`` (the paper's CSSV): the Shapley value of v_c(S) = cos(G_c(S), G_c(all)), v_c(∅) = 0,
  over all 2^n coalitions; exact up to ``max_exact_clients`` (default 14) clients, a ConfigError above.
- ``'monte-carlo'``: the same Shapley value estimated from ``permutations`` random client orderings.

γ_i = mean_c s_{i,c}, smoothed by γ ← μ·γ + (1−μ)·γ_new (μ = ``ema_momentum`` = 0.9 per the spec; the released
scripts use 0.5 for CIFAR and 0.95 for the synthetic task); a client's first score initialises γ directly.

Aggregation (``aggregation``): ``'shapley'`` = ShapFed-WA, w_global = Σ_i (γ_i/Σγ)·w_i (uniform before the
first scores); ``'uniform'`` = 1/N (the code's ``--aggregation 1``); ``'samples'`` = n_i/Σn.

Personalised reward (``reward_scale``): w̄_i = (1 − c_i)·w_i + c_i·w_global with c_i = γ_i/max γ
(``'max'``, the paper; the top contributor receives the global model) or c_i = γ_i/Σγ (``'sum'``, what
the released code's ``server.broadcast(coefficients=weights)`` applies). Clients continue training from w̄_i.

Normalised weights (``score_weights``): ``'sum'`` (default; the paper's γ_i/Σγ and the released code's
``shapley_values / np.sum(shapley_values)``: a negative γ gives a negative weight), ``'clip'`` ([ours]:
negative γ count as 0, so a client whose head update points against the aggregate gets no weight) or
``'softmax'`` (the code's commented-out alternative). Uniform when the weights cannot be normalised
(Σγ ≤ 0). The personalisation coefficients c_i are clipped to [0, 1] in every mode.

Deviations [ours]: clients that send nothing keep their γ and model (they are left out of that round's
coalitions and aggregate) and still receive the personalisation step; ``first_round_epochs`` (the code trains
5 local epochs in its first round) is available but off by default.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.algorithms.own_model import OwnModelStrategy
from fedhet.algorithms.params import check_choice, check_integer, check_number, check_positive
from fedhet.engine.protocol import FederationInfo, Reply, Weights
from fedhet.errors import ConfigError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

CONTRIBUTIONS = ("grand-coalition", "exact-shapley", "monte-carlo")
AGGREGATIONS = ("shapley", "uniform", "samples")
REWARD_SCALES = ("max", "sum")
SCORE_WEIGHTS = ("sum", "clip", "softmax")
#: 2^14 coalitions × K classes × (D+1) head entries stays well under a gigabyte for fedhet's heads.
EXACT_LIMIT = 14

log = logging.getLogger("fedhet")


def class_vectors(head_update: Mapping[str, Tensor], weight_key: str, bias_key: str | None) -> Tensor:
    """(K, D[+1]) per-class vectors: row c of the head's weight update, with bias c appended if present."""
    w = head_update[weight_key].double()
    if bias_key is None:
        return w
    return torch.cat([w, head_update[bias_key].double().reshape(-1, 1)], dim=1)


def _coalition_cosines(vectors: Tensor, weights: Tensor, members: Tensor) -> Tensor:
    """v_c(S) = cos(G_c(S), G_c(all)) for coalitions given as rows of a 0/1 matrix (S, n) -> (S, K)."""
    flat = vectors.reshape(vectors.shape[0], -1)
    k = vectors.shape[1]
    w = members * weights  # (S, n)
    sums = w.sum(dim=1, keepdim=True)
    agg = (w @ flat) / torch.where(sums > 0, sums, torch.ones_like(sums))
    agg = agg.reshape(-1, k, vectors.shape[2])
    full = (weights @ flat / weights.sum()).reshape(k, vectors.shape[2])
    dots = (agg * full).sum(dim=2)
    norms = agg.norm(dim=2) * full.norm(dim=1)
    out = dots / norms.clamp_min(1e-12)
    out[sums.reshape(-1) <= 0] = 0.0  # v(∅) = 0
    return out


def grand_coalition_scores(vectors: Tensor, weights: Tensor) -> Tensor:
    """Released-code CSSV: s_{i,c} = cos(g_{i,c}, G_c(all)), (n, K, D) -> (n, K)."""
    full = torch.einsum("i,ikd->kd", weights / weights.sum(), vectors)
    dots = (vectors * full).sum(dim=2)
    return dots / (vectors.norm(dim=2) * full.norm(dim=1)).clamp_min(1e-12)


def exact_shapley_scores(vectors: Tensor, weights: Tensor) -> Tensor:
    """Paper CSSV: exact class-wise Shapley values of v_c(S) = cos(G_c(S), G_c(all)), (n, K, D) -> (n, K).

    φ_{i,c} = Σ_{S ⊆ N∖{i}} |S|!(n−|S|−1)!/n! · (v_c(S ∪ {i}) − v_c(S)), with v_c(∅) = 0.
    """
    n = vectors.shape[0]
    codes = torch.arange(2**n)
    members = ((codes.unsqueeze(1) >> torch.arange(n)) & 1).double()  # (2^n, n), bit j = client j
    values = _coalition_cosines(vectors, weights, members)  # (2^n, K)
    sizes = members.sum(dim=1).long()
    coef = torch.tensor(
        [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)],
        dtype=torch.float64,
    )
    out = torch.zeros(n, vectors.shape[1], dtype=torch.float64)
    for i in range(n):
        without = codes[(codes >> i) & 1 == 0]
        gain = values[without | (1 << i)] - values[without]
        out[i] = (coef[sizes[without]].unsqueeze(1) * gain).sum(dim=0)
    return out


def monte_carlo_shapley_scores(
    vectors: Tensor, weights: Tensor, permutations: int, rng: np.random.Generator
) -> Tensor:
    """Permutation-sampling estimate of :func:`exact_shapley_scores` (mean marginal over random orders)."""
    n = vectors.shape[0]
    out = torch.zeros(n, vectors.shape[1], dtype=torch.float64)
    for _ in range(permutations):
        order = rng.permutation(n)
        members = torch.zeros(n + 1, n, dtype=torch.float64)
        for pos, client in enumerate(order):
            members[pos + 1 :, client] = 1.0
        values = _coalition_cosines(vectors, weights, members)  # prefixes of the order, ∅ first
        for pos, client in enumerate(order):
            out[client] += values[pos + 1] - values[pos]
    return out / permutations


def normalised_weights(gamma: np.ndarray, mode: str = "sum") -> np.ndarray:
    """w = γ/Σγ ('sum'), max(γ, 0)/Σ max(γ, 0) ('clip') or softmax(γ); uniform if the sum is ≤ 0."""
    g = np.asarray(gamma, dtype=np.float64)
    if mode == "softmax":
        e = np.exp(g - g.max())
        return e / e.sum()
    if mode == "clip":
        g = np.clip(g, 0.0, None)
    total = float(g.sum())
    return g / total if total > 0 else np.full(g.shape, 1.0 / g.size)


def personalise(own: Weights, global_weights: Weights, coefficient: float, keys: Sequence[str]) -> Weights:
    """The personalisation step as a delta: c·(w_global − w_i), so that w_i + δ = (1−c)·w_i + c·w_global."""
    return {k: coefficient * (global_weights[k] - own[k]) for k in keys}


class ShapFed(OwnModelStrategy):
    """ShapFed (Tastan et al., IJCAI'24): class-wise Shapley contributions, weighted aggregation, rewards.

    Contributions come from last-layer updates; ShapFed-WA aggregation; personalised reward models.
    """

    name = "shapfed"
    model_needs = frozenset({"head"})
    local_update = "keep"

    def __init__(
        self,
        contribution: str = "grand-coalition",
        ema_momentum: float = 0.9,
        aggregation: str = "shapley",
        reward_scale: str = "max",
        permutations: int = 200,
        max_exact_clients: int = EXACT_LIMIT,
        first_round_epochs: float | None = None,
        score_weights: str = "sum",
        protocol: str = "own-model",
    ) -> None:
        super().__init__(protocol=protocol)
        self.score_weights = check_choice(
            "score_weights",
            score_weights,
            SCORE_WEIGHTS,
            hint="'sum': γ/Σγ, the paper and code; 'clip': negative γ as 0 [ours]; 'softmax': the code's "
            "commented alternative",
        )
        self.contribution = check_choice("contribution", contribution, CONTRIBUTIONS)
        self.ema_momentum = check_number(
            "ema_momentum", ema_momentum, 0.0, 1.0, high_open=True, hint="μ of γ ← μ·γ + (1−μ)·γ_new (0.9)"
        )
        self.aggregation = check_choice("aggregation", aggregation, AGGREGATIONS)
        self.reward_scale = check_choice("reward_scale", reward_scale, REWARD_SCALES)
        self.permutations = check_integer("permutations", permutations, 1)
        self.max_exact_clients = check_integer("max_exact_clients", max_exact_clients, 1, 20)
        if first_round_epochs is not None:
            first_round_epochs = check_positive("first_round_epochs", first_round_epochs)
        self.first_round_epochs = first_round_epochs

    def setup(self, info: FederationInfo) -> None:
        if self.contribution == "exact-shapley" and info.num_clients > self.max_exact_clients:
            raise ConfigError(
                f"method 'shapfed' with contribution='exact-shapley' enumerates 2^N coalitions; N = "
                f"{info.num_clients} exceeds max_exact_clients = {self.max_exact_clients}. Use "
                "contribution='monte-carlo' (with permutations=...) or raise max_exact_clients (<= 20)"
            )
        super().setup(info)  # the engine checked model_needs: a FedModel with a head
        keys = self.model.head_keys()
        self.head_weight = next((k for k in keys if k.endswith("weight")), None)
        self.head_bias = next((k for k in keys if k.endswith("bias")), None)
        if self.head_weight is None:
            raise ConfigError(f"method 'shapfed': the model's head has no weight (keys {keys})")
        n = info.num_clients
        self.gamma = np.zeros(n)
        self.scored = np.zeros(n, dtype=bool)
        self.class_scores = np.zeros((n, info.num_classes))
        self.weights = np.full(n, 1.0 / n)
        self.mixing = np.full(n, 1.0 / n)
        self._warned_off_simplex = False

    def client_config(self, rnd: int, cid: int) -> dict[str, Any]:
        cfg: dict[str, Any] = {"local_update": "keep"}
        if self.first_round_epochs is not None and self.rounds_done == 0:
            cfg["local_epochs"] = self.first_round_epochs
        return cfg

    def scores(self, vectors: Tensor, weights: Tensor) -> Tensor:
        """s_{i,c} (n, K) for the chosen ``contribution`` rule."""
        if self.contribution == "grand-coalition":
            return grand_coalition_scores(vectors, weights)
        if self.contribution == "exact-shapley":
            return exact_shapley_scores(vectors, weights)
        return monte_carlo_shapley_scores(vectors, weights, self.permutations, self.info.rng)

    def server_round(
        self, rnd: int, starts: dict[int, Weights], updates: dict[int, Weights], replies: dict[int, Reply]
    ) -> None:
        n = self.info.num_clients
        ids = sorted(updates)
        if ids:
            # g = (w_init − w_final) = −Δ on the head (the 1/lr factor cancels in the cosines)
            vectors = torch.stack(
                [-class_vectors(updates[c], self.head_weight, self.head_bias) for c in ids]
            )  # (n, K, D+1)
            w = torch.tensor(self.mixing[ids], dtype=torch.float64)
            w = (
                w / w.sum()
                if float(w.sum()) > 0
                else torch.full((len(ids),), 1.0 / len(ids), dtype=torch.float64)
            )
            s = self.scores(vectors, w).numpy()
            mu = self.ema_momentum
            for row, cid in enumerate(ids):
                if self.scored[cid]:
                    self.class_scores[cid] = mu * self.class_scores[cid] + (1 - mu) * s[row]
                    self.gamma[cid] = mu * self.gamma[cid] + (1 - mu) * s[row].mean()
                else:
                    self.class_scores[cid] = s[row]
                    self.gamma[cid] = s[row].mean()
                    self.scored[cid] = True
            self.weights = normalised_weights(self.gamma, self.score_weights)
            self._warn_off_simplex(rnd)
            if self.aggregation == "shapley":
                self.mixing = self.weights.copy()
            elif self.aggregation == "uniform":
                self.mixing = np.full(n, 1.0 / n)
            else:
                self.mixing = self.sizes / self.sizes.sum() if self.sizes.sum() > 0 else np.full(n, 1.0 / n)
            p = self.mixing[ids]
            p = p / p.sum() if p.sum() > 0 else np.full(len(ids), 1.0 / len(ids))
            trained = [self.client_models[c] for c in ids]
            current = self.model.state_dict()
            self.model.load_state_dict({**current, **self.combine(trained, p, center=current)})
        global_sd = self.model.state_dict()
        coef = self.reward_coefficients()
        for cid in range(n):
            self.give_reward(
                cid, personalise(self.client_models[cid], global_sd, float(coef[cid]), self.float_keys)
            )

    def _warn_off_simplex(self, rnd: int) -> None:
        """Say once per run when γ/Σγ leaves the simplex: a negative weight, the start of a divergence."""
        if self._warned_off_simplex or float(self.weights.min()) >= 0.0:
            return
        self._warned_off_simplex = True
        log.warning(
            "round %d: ShapFed's weights γ/Σγ left the simplex (min %.3g, max %.3g): some γ are negative,"
            " and as Σγ shrinks the aggregate can diverge (measured under strong label skew, see"
            " docs/baselines.md). --set method.params.score_weights=clip or =softmax keeps them on it",
            rnd,
            float(self.weights.min()),
            float(self.weights.max()),
        )

    def reward_coefficients(self) -> np.ndarray:
        """c_i in [0, 1] of the personalisation: γ_i/max γ ('max', paper) or the mixing weight ('sum')."""
        positive = np.clip(self.gamma, 0.0, None)
        if self.reward_scale == "sum":
            c = self.mixing
        else:
            c = positive / positive.max() if positive.max() > 0 else np.ones_like(positive)
        return np.clip(c, 0.0, 1.0)

    def contributions(self) -> np.ndarray | None:
        """Normalised contributions (``score_weights``: γ_i/Σγ by default) once clients have been scored."""
        return None if not self.scored.any() else self.weights.copy()

    def client_columns(self) -> dict[str, Sequence[float]]:
        cols = super().client_columns()
        cols["gamma"] = self.gamma.tolist()
        cols["reward_coefficient"] = self.reward_coefficients().tolist()
        return cols

    def extra_state(self) -> dict[str, Any]:
        return {
            "gamma": self.gamma.copy(),
            "scored": self.scored.astype(np.int64),
            "class_scores": self.class_scores.copy(),
            "weights": self.weights.copy(),
            "mixing": self.mixing.copy(),
        }

    def load_extra_state(self, sd: Mapping[str, Any]) -> None:
        self.gamma = np.asarray(sd["gamma"], dtype=np.float64).copy()
        self.scored = np.asarray(sd["scored"]).astype(bool)
        self.class_scores = np.asarray(sd["class_scores"], dtype=np.float64).copy()
        self.weights = np.asarray(sd["weights"], dtype=np.float64).copy()
        self.mixing = np.asarray(sd["mixing"], dtype=np.float64).copy()
