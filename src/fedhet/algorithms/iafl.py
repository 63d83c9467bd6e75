"""IAFL — Wu et al., "Incentive-Aware Federated Learning with Training-Time Model Rewards", ICLR 2024
(baselines.md §2.5; verified against ``ZhaoxuanWu/Incentive-Aware-FL`` ``main_IAFL.py``).

Contributions p_i (``contribution``): local data size (default, the code's option 1) or standalone test
accuracy (``'standalone'``, the code's option 2 and FedRAC's choice; the reference contributions of the
standalone pre-pass, ``FederationInfo.reference_contributions``). Reward rates γ_i = min(p_i/p_ceil, 1)
with p_ceil = max_j p_j. Data sizes are the clients' self-reported sample counts.

Per round:

1. Stochastic recovery: with probability q (``recovery_probability``) each client's model is reset to the
   reference (server) model — drawn for every client, sampled or not, as in the code.
2. The clients that join (J: those that replied) train from their own model, upload Δ_i and reset.
3. Reward-set size k_i = ⌈γ_i^(1−κ)·(|J| − 1)⌉ (κ = ``sharing``): client i's reward is the uniform average of
   its own Δ_i (if it joined) and k_i updates drawn without replacement from the other joined clients; it is
   added to i's model. Clients that did not join still receive their k_i others' updates.
4. The reference model applies the reward set of the top contributor (argmax γ).

Defaults: κ = 0 (the code's default), q = 0.1 [ours: the code's default is q = 0; the paper sweeps q > 0 and
the spec asks for 0.1–0.2]. The participation-rate contribution (the code's option 3) is not offered: the
engine's ``train.client_dropout`` is the same for every client.

Deviations [ours]: k_i is floored at 0 (with |J| = 0 the code's ⌈γ·(−1)⌉ = −1 would crash
``np.random.choice``) and capped at the number of other joined clients; random draws use the strategy's seeded
generator (checkpointed), not numpy's global one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedhet.algorithms.own_model import OwnModelStrategy
from fedhet.algorithms.params import check_choice, check_number
from fedhet.engine.protocol import FederationInfo, Reply, Weights
from fedhet.errors import ConfigError

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1

CONTRIBUTIONS = ("data-size", "standalone")


def iafl_reward_rates(contributions: np.ndarray) -> np.ndarray:
    """γ_i = min(p_i / max_j p_j, 1)."""
    p = np.asarray(contributions, dtype=np.float64)
    if p.max() <= 0:
        raise ConfigError(f"IAFL needs a positive contribution for at least one client, got {p.tolist()}")
    return np.minimum(p / p.max(), 1.0)


def iafl_reward_set_sizes(rates: np.ndarray, sharing: float, joined: int) -> np.ndarray:
    """k_i = ⌈γ_i^(1−κ)·(|J| − 1)⌉, floored at 0 (κ = sharing, |J| = number of joined clients)."""
    raw = np.power(np.asarray(rates, dtype=np.float64), 1.0 - sharing) * (joined - 1)
    # A tiny tolerance so that e.g. 0.3·10 = 3.0000000000000004 does not become 4.
    return np.maximum(0, np.ceil(raw - 1e-9)).astype(int)


class IAFL(OwnModelStrategy):
    """IAFL (Wu et al., ICLR'24): contribution-sized random reward sets of updates, stochastic recovery.

    Each client's model gets the average of a random set of updates whose size grows with its contribution.
    """

    name = "iafl"
    local_update = "reset"

    def __init__(
        self,
        sharing: float = 0.0,
        recovery_probability: float = 0.1,
        contribution: str = "data-size",
        protocol: str = "own-model",
    ) -> None:
        super().__init__(protocol=protocol)
        self.sharing = check_number("sharing", sharing, 0.0, 1.0, high_open=True, hint="κ ∈ [0, 1)")
        self.recovery_probability = check_number(
            "recovery_probability", recovery_probability, 0.0, 1.0, hint="q, the chance of a reset per round"
        )
        self.contribution = check_choice("contribution", contribution, CONTRIBUTIONS)

    def requirements(self) -> frozenset[str]:
        """``contribution='standalone'`` takes the clients' standalone accuracies as its contributions."""
        return frozenset({"reference_contributions"}) if self.contribution == "standalone" else frozenset()

    def setup(self, info: FederationInfo) -> None:
        super().setup(info)
        self.last_sizes = np.zeros(info.num_clients, dtype=int)
        self.recoveries = 0
        if self.contribution == "standalone":
            self.set_contributions(info.reference_contributions)

    def receive_descriptions(self, descriptions: Mapping[int, Reply]) -> None:
        """With ``contribution='data-size'`` (the default), p_i = the self-reported sample count."""
        super().receive_descriptions(descriptions)
        if self.contribution == "data-size":
            self.set_contributions(self.sizes)

    def set_contributions(self, contributions: np.ndarray) -> None:
        """p, the reward rates γ and the top contributor."""
        self.p = np.asarray(contributions, dtype=np.float64).copy()
        self.rates = iafl_reward_rates(self.p)
        self.top = int(np.argmax(self.rates))

    def before_round(self, rnd: int, client_ids: list[int]) -> None:
        q = self.recovery_probability
        if q <= 0:
            return
        reference = self.model.state_dict()
        draws = self.info.rng.random(self.info.num_clients)
        for cid in range(self.info.num_clients):
            if draws[cid] < q:
                self.set_client_model(cid, reference)
                self.recoveries += 1

    def server_round(
        self, rnd: int, starts: dict[int, Weights], updates: dict[int, Weights], replies: dict[int, Reply]
    ) -> None:
        n = self.info.num_clients
        joined = sorted(updates)
        sizes = iafl_reward_set_sizes(self.rates, self.sharing, len(joined))
        self.last_sizes = sizes
        reward_sets: list[list[int]] = []
        for cid in range(n):
            others = [j for j in joined if j != cid]
            k = min(int(sizes[cid]), len(others))
            chosen = sorted(int(j) for j in self.info.rng.choice(others, k, replace=False)) if k > 0 else []
            members = sorted(set(chosen) | ({cid} if cid in updates else set()))
            reward_sets.append(members)
            if members:
                self.give_reward(cid, self._average(updates, members))
        top_set = reward_sets[self.top]
        if top_set:
            self.apply_to_global(self._average(updates, top_set))

    def _average(self, updates: dict[int, Weights], members: Sequence[int]) -> Weights:
        return self.combine([updates[j] for j in members], [1.0 / len(members)] * len(members))

    def contributions(self) -> np.ndarray | None:
        """The contributions p normalised to sum 1 (data shares by default)."""
        return self.p / self.p.sum()

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        out = super().round_metrics(rnd)
        out["iafl_reward_set_sizes"] = [int(k) for k in self.last_sizes]
        return out

    def client_columns(self) -> dict[str, Sequence[float]]:
        cols = super().client_columns()
        cols["reward_rate"] = self.rates.tolist()
        cols["last_reward_set_size"] = [int(k) for k in self.last_sizes]
        return cols

    def extra_state(self) -> dict[str, Any]:
        return {"last_sizes": self.last_sizes.astype(np.int64), "recoveries": int(self.recoveries)}

    def load_extra_state(self, sd: Mapping[str, Any]) -> None:
        self.last_sizes = np.asarray(sd["last_sizes"]).astype(int)
        self.recoveries = int(sd["recoveries"])
