"""CGSV — Xu et al., "Gradient-Driven Rewards to Guarantee Fairness in Collaborative Machine Learning",
NeurIPS 2021 (baselines.md §2.3; verified against ``XinyiYS/Gradient-Driven-Rewards-...`` ``main.py``).

Per round t, every client i trains its own model, uploads Δ_i and resets to where it started. The server

1. normalises Δ̃_i = Γ·Δ_i / (‖Δ_i‖ + 1e-7)                       (Γ = ``update_norm``);
2. aggregates u = Σ_i w_i Δ̃_i with w = data shares in the first round, w = r afterwards, and applies u to
   the server model;
3. scores ψ_i = cos(flat(Δ̃_i), flat(u))               (cosine gradient Shapley, grand coalition only);
4. updates reputations r ← α·r + (1−α)·ψ, clamps r ≥ 1e-3 and normalises Σr = 1 (α = ``reputation_momentum``,
   r starts at 0 as in the code);
5. gives client i the reward fraction q_i = tanh(β·r_i) / max_j tanh(β·r_j) (β = ``altruism``) and adds to its
   model the per-layer top-⌈q_i·|layer|⌉ entries of u (the highest-reputation client gets all of u).

Defaults: Γ = 0.15, α = 0.95, β = 1.0 — the values of the CELM author's own CGSV baseline
(``asimukaye/simplefl`` ``cgsv.py``, methods.md §1.4) and CGSV's CIFAR setting (Γ = 0.5 for MNIST in the
reference; its β sweep is {0.5, 1, 1.2, 1.5, 2, 1e7}).

Options mirroring the CELM author's variant (``simplefl`` ``cgsv.py``): ``normalization='clip'`` rescales Δ
only when ‖Δ‖ > Γ; ``keep_local_update=True`` lets each client keep its own trained update instead of
resetting (that code comments out the reset).

Deviations [ours], all documented in docs/baselines.md:

- Top-k keeps exactly ⌈q·n⌉ entries per tensor; the reference keeps entries ≥ the k-th largest with k
  capped at n − 1, so its q = 1 reward drops a layer's smallest entry and ties can keep more.
- Clients that send nothing in a round (dropped, rejected) keep their reputation (no EMA step), the
  aggregate is renormalised over the clients that replied, and everyone still receives the round's reward.

The reputations r are the method's contribution estimates (``contributions()``). CELM reports that CGSV's
global accuracy falls far below FedAvg under label skew, with 0% rare-class recall on the maverick split,
because ψ rewards similarity to the average; that behaviour is reproduced, not corrected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedhet.algorithms.own_model import (
    OwnModelStrategy,
    cosine,
    flatten,
    normalise_update,
    topk_per_layer,
)
from fedhet.algorithms.params import check_choice, check_flag, check_number, check_positive
from fedhet.engine.protocol import FederationInfo, Reply, Weights

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

NORMALIZATIONS = ("scale", "clip")


def cgsv_reputation_update(
    reputations: np.ndarray,
    scores: np.ndarray,
    momentum: float,
    floor: float = 1e-3,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """CGSV step 5: r ← α·r + (1−α)·ψ (only where ``mask``), clamp r ≥ ``floor``, normalise to Σr = 1."""
    r = np.asarray(reputations, dtype=np.float64).copy()
    psi = np.asarray(scores, dtype=np.float64)
    m = np.ones_like(r, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    r[m] = momentum * r[m] + (1.0 - momentum) * psi[m]
    r = np.maximum(r, floor)
    return r / r.sum()


def cgsv_reward_fractions(reputations: np.ndarray, altruism: float) -> np.ndarray:
    """CGSV step 6: q_i = tanh(β·r_i) / max_j tanh(β·r_j) (β = altruism; q = 1 for the top client)."""
    t = np.tanh(altruism * np.asarray(reputations, dtype=np.float64))
    return t / t.max()


class CGSV(OwnModelStrategy):
    """CGSV (Xu et al., NeurIPS'21): cosine gradient Shapley reputations and tanh-sized top-k rewards.

    Normalised updates, EMA reputations, per-layer top-k sparsified rewards into each client's own model.
    """

    name = "cgsv"
    local_update = "reset"

    def __init__(
        self,
        update_norm: float = 0.15,
        reputation_momentum: float = 0.95,
        altruism: float = 1.0,
        reputation_floor: float = 1e-3,
        normalization: str = "scale",
        sparsify: bool = True,
        keep_local_update: bool = False,
        protocol: str = "own-model",
    ) -> None:
        super().__init__(protocol=protocol)
        self.update_norm = check_positive(
            "update_norm", update_norm, hint="Γ, the norm of every normalised update (0.15 CIFAR, 0.5 MNIST)"
        )
        self.reputation_momentum = check_number(
            "reputation_momentum",
            reputation_momentum,
            0.0,
            1.0,
            high_open=True,
            hint="α of r ← α·r + (1−α)·ψ; the paper uses 0.95",
        )
        self.altruism = check_number(
            "altruism",
            altruism,
            0.0,
            float("inf"),
            low_open=True,
            hint="β of q = tanh(β r)/max tanh(β r); large values give everyone all of u",
        )
        self.reputation_floor = check_number("reputation_floor", reputation_floor, 0.0, 1.0, low_open=True)
        self.normalization = check_choice("normalization", normalization, NORMALIZATIONS)
        self.sparsify = check_flag("sparsify", sparsify)
        self.local_update = "keep" if check_flag("keep_local_update", keep_local_update) else "reset"
        self.reputations: np.ndarray | None = None
        self.last_scores: np.ndarray | None = None
        self.reward_fractions: np.ndarray | None = None

    def setup(self, info: FederationInfo) -> None:
        super().setup(info)
        # r starts at 0 (the reference's torch.zeros); the first round aggregates with data shares.
        self.reputations = np.zeros(info.num_clients)
        self.last_scores = np.zeros(info.num_clients)
        self.reward_fractions = np.ones(info.num_clients)

    def server_round(
        self, rnd: int, starts: dict[int, Weights], updates: dict[int, Weights], replies: dict[int, Reply]
    ) -> None:
        if not updates:
            return
        ids = sorted(updates)
        normed = [
            normalise_update(updates[c], self.param_keys, self.update_norm, self.normalization) for c in ids
        ]
        if self.rounds_done == 0:
            w = self.sizes[ids]
        else:
            w = self.reputations[ids]
        w = w / w.sum() if w.sum() > 0 else np.full(len(ids), 1.0 / len(ids))
        u = self.combine(normed, w)
        self.apply_to_global(u)
        flat_u = flatten(u, self.param_keys)
        psi = np.zeros(self.info.num_clients)
        for c, d in zip(ids, normed, strict=True):
            psi[c] = cosine(flatten(d, self.param_keys), flat_u)
        mask = np.zeros(self.info.num_clients, dtype=bool)
        mask[ids] = True
        self.last_scores = psi
        self.reputations = cgsv_reputation_update(
            self.reputations, psi, self.reputation_momentum, self.reputation_floor, mask
        )
        self.reward_fractions = cgsv_reward_fractions(self.reputations, self.altruism)
        for cid in range(self.info.num_clients):
            reward = (
                topk_per_layer(u, float(self.reward_fractions[cid]), self.param_keys) if self.sparsify else u
            )
            self.give_reward(cid, reward)

    def contributions(self) -> np.ndarray | None:
        """The reputations r (Σr = 1) once a round has been aggregated."""
        return None if self.rounds_done == 0 or self.reputations is None else self.reputations.copy()

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        out = super().round_metrics(rnd)
        if self.rounds_done:
            out["cgsv_reward_fractions"] = [float(q) for q in self.reward_fractions]
        return out

    def client_columns(self) -> dict[str, Sequence[float]]:
        cols = super().client_columns()
        cols["last_cosine"] = self.last_scores.tolist()
        cols["reward_fraction"] = self.reward_fractions.tolist()
        return cols

    def extra_state(self) -> dict[str, Any]:
        return {
            "reputations": self.reputations.copy(),
            "last_scores": self.last_scores.copy(),
            "reward_fractions": self.reward_fractions.copy(),
        }

    def load_extra_state(self, sd: Mapping[str, Any]) -> None:
        self.reputations = np.asarray(sd["reputations"], dtype=np.float64).copy()
        self.last_scores = np.asarray(sd["last_scores"], dtype=np.float64).copy()
        self.reward_fractions = np.asarray(sd["reward_fractions"], dtype=np.float64).copy()
