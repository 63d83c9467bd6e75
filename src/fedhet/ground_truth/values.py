"""Contribution values from the utility of every coalition: exact Shapley, Banzhaf and leave-one-out.

A utility table ``u`` holds one number per coalition of the N clients, indexed by the coalition's bitmask
(client i is in coalition S when bit i of S is set; ``u[0]`` is the empty coalition, ``u[2**N - 1]`` the
whole federation). Nothing here trains: :mod:`fedhet.ground_truth.coalitions` measures the utilities.
"""

from __future__ import annotations

import math

import numpy as np

from fedhet.errors import ConfigError


def _table(utility: np.ndarray) -> tuple[np.ndarray, int]:
    u = np.asarray(utility, dtype=np.float64)
    n = int(u.size).bit_length() - 1
    if u.ndim != 1 or n < 1 or u.size != 1 << n:
        raise ConfigError(f"a utility table has 2**N entries (one per coalition), got shape {u.shape}")
    if not np.all(np.isfinite(u)):
        raise ConfigError("the utility table holds non-finite values; every coalition needs a utility")
    return u, n


def coalition_sizes(n: int) -> np.ndarray:
    """|S| for every bitmask S of n clients."""
    masks = np.arange(1 << n)
    return np.array([bin(int(m)).count("1") for m in masks], dtype=np.int64)


def marginal_gains(utility: np.ndarray, client: int) -> tuple[np.ndarray, np.ndarray]:
    """(u(S ∪ {i}) − u(S), |S|) for every coalition S not holding client i."""
    u, n = _table(utility)
    masks = np.arange(1 << n)
    without = masks[(masks >> client) & 1 == 0]
    return u[without | (1 << client)] - u[without], coalition_sizes(n)[without]


def shapley_values(utility: np.ndarray) -> np.ndarray:
    """φ_i = Σ_{S ⊆ N∖{i}} |S|! (N − |S| − 1)! / N! · (u(S ∪ {i}) − u(S)) (Shapley, 1953): each client's
    marginal gain averaged over every order in which the federation could form. Σ_i φ_i = u(N) − u(∅)."""
    _, n = _table(utility)
    weight = np.array([math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)])
    out = np.empty(n)
    for i in range(n):
        gains, sizes = marginal_gains(utility, i)
        out[i] = float(np.sum(weight[sizes] * gains))
    return out


def banzhaf_values(utility: np.ndarray) -> np.ndarray:
    """β_i = 2^−(N−1) Σ_{S ⊆ N∖{i}} (u(S ∪ {i}) − u(S)) (Banzhaf, 1965): the gain averaged over coalitions
    alike, so it weighs the many mid-sized coalitions more than Shapley does."""
    _, n = _table(utility)
    return np.array([float(np.mean(marginal_gains(utility, i)[0])) for i in range(n)])


def leave_one_out_values(utility: np.ndarray) -> np.ndarray:
    """u(N) − u(N ∖ {i}): what the federation loses without client i alone (0 for a client whose data
    another client duplicates, however useful that data is)."""
    u, n = _table(utility)
    full = (1 << n) - 1
    return np.array([u[full] - u[full & ~(1 << i)] for i in range(n)])


VALUES = {"shapley": shapley_values, "banzhaf": banzhaf_values, "leave_one_out": leave_one_out_values}


def t_interval(values: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds (axis 0) and the half-width of its two-sided Student-t interval (NaN for one seed)."""
    from scipy import stats

    v = np.asarray(values, dtype=np.float64)
    mean = v.mean(axis=0)
    k = v.shape[0]
    if k < 2:
        return mean, np.full_like(mean, np.nan)
    half = stats.t.ppf(0.5 + level / 2, k - 1) * v.std(axis=0, ddof=1) / math.sqrt(k)
    return mean, half


__all__ = ["VALUES", "banzhaf_values", "leave_one_out_values", "shapley_values", "t_interval"]
