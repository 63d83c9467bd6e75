"""Per-round Shapley values over models reconstructed from a round's replies: the exact value and GTG-Shapley.

In round t the server holds the model it sent, w_t, and the accepted replies: client i's model w_i (an
update Δ_i = w_i − w_t) trained on n_i samples. The model of a subset S of those clients is the one FedAvg
would have aggregated from S alone,

    M_S = w_t + Σ_{i∈S} n_i Δ_i / Σ_{i∈S} n_i,        M_∅ = w_t,

the gradient-based reconstruction of Song, Tong and Wei ("Profit Allocation for Federated Learning", IEEE
BigData 2019) that GTG-Shapley reuses (Liu, Chen, Yu, Liu and Cui, "GTG-Shapley: Efficient and Accurate
Participant Contribution Evaluation in Federated Learning", ACM TIST 2022, arXiv 2109.02053: the model of a
permutation's prefix in its Algorithm 1), so no subset is trained again. With a utility U (the accuracy
of a model on the server's validation set), round t is a cooperative game v_t(S) = U(M_S) whose grand
coalition is the aggregate, v_t(N) = U(w_{t+1}) for FedAvg.

- :func:`exact_round_shapley`: the Shapley value of that game, every one of its 2^N subsets evaluated (the
  per-round reconstruction value that ``or-shapley`` reports; see the note there on the variant).
- :func:`gtg_shapley_round`: GTG-Shapley's estimate of the same value (Liu et al., Algorithm 1): skip a round
  whose utility barely moved (between-round truncation), sample permutations with each client first in turn
  (guided sampling), stop a permutation once its prefix is as good as the whole round (within-round
  truncation), and stop sampling when the running estimate settles.

Everything here is a pure function of the weights, the counts and a utility callable, so it is tested with toy
utilities; :mod:`fedhet.contributions.tracker` binds it to a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from fedhet.averaging import weighted_average
from fedhet.errors import ConfigError

Weights = dict[str, Tensor]


# --------------------------------------------------------------------------------------------------------
# The model of a subset
# --------------------------------------------------------------------------------------------------------
def reconstruct(
    start: Mapping[str, Tensor],
    models: Sequence[Mapping[str, Tensor]],
    num_examples: Sequence[float],
    members: Sequence[int],
) -> Mapping[str, Tensor]:
    """M_S = w_t + Σ_{i∈S} n_i Δ_i / Σ_{i∈S} n_i for S = ``members`` (indices into ``models``), ``start``
    itself for the empty set (Song et al. 2019; GTG-Shapley's Algorithm 1, the model of a prefix).

    Computed as Σ_{i∈S} p_i w_i with p_i = n_i / Σ_{i∈S} n_j, which is the same model (Σ p_i = 1), in the
    order and float arithmetic of FedAvg's aggregation: M_N is then bit for bit the model FedAvg aggregates
    from the same replies, so U(M_N) = U(w_{t+1}) exactly. Integer buffers (BatchNorm's counters) are the
    first member's, as FedAvg keeps them; members whose counts are all 0 are averaged uniformly (FedAvg's
    fallback)."""
    if not members:
        return start
    counts = [float(num_examples[i]) for i in members]
    if float(np.sum(counts)) <= 0:
        counts = [1.0] * len(members)
    return weighted_average([models[i] for i in members], counts)


def members_of(mask: int) -> list[int]:
    """The indices of the set bits of ``mask``, ascending (a subset as a bitmask, client i = bit i)."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


# --------------------------------------------------------------------------------------------------------
# The exact per-round value
# --------------------------------------------------------------------------------------------------------
def shapley_from_table(table: np.ndarray) -> np.ndarray:
    """φ_i = Σ_{S ⊆ N∖{i}} |S|! (N − |S| − 1)! / N! · (v(S ∪ {i}) − v(S)) (Shapley, 1953: the definition
    GTG-Shapley starts from) from ``table[S]`` = v(S) for every bitmask S. Σ_i φ_i = v(N) − v(∅)."""
    v = np.asarray(table, dtype=np.float64)
    n = int(v.size).bit_length() - 1
    if v.ndim != 1 or v.size != 1 << n:
        raise ConfigError(f"a subset-utility table has 2**N entries, one per subset; got shape {v.shape}")
    weight = [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)]
    phi = np.zeros(n)
    for mask in range(1 << n):
        size = bin(mask).count("1")
        for i in range(n):
            if not mask >> i & 1:
                phi[i] += weight[size] * (v[mask | 1 << i] - v[mask])
    return phi


def exact_round_shapley(utilities: Callable[[Sequence[int]], Sequence[float]], n: int) -> np.ndarray:
    """The exact Shapley value of one round's game v(S) = U(M_S) over its ``n`` replies, every subset
    evaluated: ``utilities(masks)`` returns v(S) for each bitmask S, all 2^n asked at once (so the caller
    can evaluate them in batches). Cost: 2^n evaluations per round, so for n up to about a dozen.

    Summed over rounds this is what ``or-shapley`` reports: the per-round reconstruction value of Song et
    al. (2019), their multi-round "MR" construction with equal round weights (λ_t = 1), which keeps exact
    per-round efficiency (Σ_i φ_i^t = U(w_{t+1}) − U(w_t)) and is the quantity GTG-Shapley estimates, so the
    two are comparable round by round. Their one-round "OR" instead values models rebuilt from the updates
    of all rounds once at the end, which needs every subset's model carried through training."""
    if n == 0:
        return np.zeros(0)
    table = np.asarray(utilities(list(range(1 << n))), dtype=np.float64)
    return shapley_from_table(table)


# --------------------------------------------------------------------------------------------------------
# GTG-Shapley
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GTGSettings:
    """GTG-Shapley's parameters (Liu et al. 2022, Algorithm 1). A threshold of 0 switches its truncation off.

    The thresholds and the convergence rule are those of the authors' lineage of implementations (truncation
    at 0.001 of accuracy; at least max(30, N) permutations, then converged when the running estimate moved
    by less than 5 % on average over the last 10 permutations: the TMC-Shapley rule of Ghorbani and Zou 2019
    that GTG-Shapley adopts); the cap of 100·N permutations is ours (the paper bounds the iterations without
    a number we could confirm). With a utility that is an accuracy on a few hundred samples, one sample is
    worth more than 0.001, so truncation fires only on ties."""

    #: ε_b: skip the round (every value 0) when |U(w_{t+1}) − U(w_t)| ≤ ε_b (between-round truncation).
    round_truncation: float = 0.001
    #: ε_w: a permutation stops, its remaining clients gaining 0, once |U(w_{t+1}) − U(M_prefix)| ≤ ε_w.
    within_truncation: float = 0.001
    #: Permutations sampled before convergence is checked; None = max(30, N).
    min_permutations: int | None = None
    #: The running estimates the convergence rule compares with the current one (the last k).
    convergence_window: int = 10
    #: Converged when the mean relative change over the window is below this.
    convergence_tolerance: float = 0.05
    #: At most this many permutations per round; None = 100·N.
    max_permutations: int | None = None


@dataclass(frozen=True)
class GTGResult:
    """One round's GTG-Shapley values and what they cost."""

    values: np.ndarray
    #: Permutations sampled (0 for a round skipped by the between-round truncation).
    permutations: int
    #: Distinct subsets whose utility the estimate needed, U(w_t) and U(w_{t+1}) included.
    evaluations: int
    #: The between-round truncation skipped the round.
    skipped: bool
    #: The convergence rule stopped the sampling (False: the cap did, or the round was skipped).
    converged: bool


def _converged(history: list[np.ndarray], window: int, tolerance: float) -> bool:
    """TMC-Shapley's rule, as GTG-Shapley uses it: the mean over clients of |φ̄_now − φ̄_k| / |φ̄_now| is
    below ``tolerance`` for each of the last ``window`` running estimates φ̄_k."""
    if len(history) < window + 1:
        return False
    now = history[-1]
    scale = np.abs(now) + 1e-12
    return all(float(np.mean(np.abs(now - past) / scale)) < tolerance for past in history[-window - 1 : -1])


def gtg_shapley_round(
    utility: Callable[[int], float],
    n: int,
    rng: np.random.Generator,
    settings: GTGSettings = GTGSettings(),
) -> GTGResult:
    """GTG-Shapley's estimate of one round's Shapley value (Liu et al. 2022, Algorithm 1); ``utility(S)`` is
    v(S) = U(M_S) for a bitmask S of the round's ``n`` replies (M_∅ = w_t, M_N = w_{t+1}).

    1. Between-round truncation: with v_0 = U(w_t) and v_N = U(w_{t+1}), the round is skipped, every φ_i = 0,
       when |v_N − v_0| ≤ ε_b.
    2. Guided Monte-Carlo sampling: permutations are drawn in blocks of n, client k first in the k-th, the
       others in an order shuffled by ``rng``; the first position is then sampled evenly (stratified), the
       estimate stays unbiased.
    3. Within-round truncation: along a permutation π, v_j = U(M_{π[1..j]}), unless |v_N − v_{j−1}| ≤ ε_w,
       where v_j = v_{j−1} (the rest of the permutation gains 0); client π[j] gains v_j − v_{j−1}, and φ is
       the running mean of the gains over the permutations (Algorithm 1's φ_{π[j]} ← (τ−1)/τ φ + 1/τ gain).
    4. Sampling stops after a whole block, at least ``min_permutations`` in, once the running estimate has
       converged (:func:`_converged`), or at ``max_permutations``.

    Each distinct subset is evaluated once (a memo: the value is the same, only the cost drops)."""
    memo: dict[int, float] = {}

    def v(mask: int) -> float:
        if mask not in memo:
            memo[mask] = float(utility(mask))
        return memo[mask]

    if n == 0:
        return GTGResult(np.zeros(0), 0, 0, False, False)
    full = (1 << n) - 1
    v0, vn = v(0), v(full)
    eps_b, eps_w = settings.round_truncation, settings.within_truncation
    if eps_b > 0 and abs(vn - v0) <= eps_b:
        return GTGResult(np.zeros(n), 0, len(memo), True, False)
    least = settings.min_permutations if settings.min_permutations is not None else max(30, n)
    most = settings.max_permutations if settings.max_permutations is not None else 100 * n
    if least < 1 or most < 1:
        raise ConfigError(f"GTG-Shapley needs at least one permutation, got min {least}, max {most}")
    totals = np.zeros(n)
    # the running estimate after each permutation
    history: list[np.ndarray] = []
    converged = False
    while len(history) < most and not converged:
        for first in range(n):
            others = [i for i in range(n) if i != first]
            order = [first, *(others[j] for j in rng.permutation(len(others)))]
            gains = np.zeros(n)
            previous, mask = v0, 0
            for client in order:
                if eps_w > 0 and abs(vn - previous) <= eps_w:
                    break  # truncated: this client and the rest gain 0
                mask |= 1 << client
                current = v(mask)
                gains[client] = current - previous
                previous = current
            totals += gains
            history.append(totals / (len(history) + 1))
            if len(history) >= most:
                break
        if len(history) >= least:
            converged = _converged(history, settings.convergence_window, settings.convergence_tolerance)
    return GTGResult(history[-1].copy(), len(history), len(memo), False, converged)


__all__ = [
    "GTGResult",
    "GTGSettings",
    "exact_round_shapley",
    "gtg_shapley_round",
    "members_of",
    "reconstruct",
    "shapley_from_table",
]
