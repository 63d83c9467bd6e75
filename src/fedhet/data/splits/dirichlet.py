"""Dirichlet label skew: Dir-client, Dir-class, Dir-flgo (``dirichlet-prior``) and Dir-pair, and the
log-space Dirichlet draws they share (baselines.md §4.1-§4.3). They are not interchangeable (§4.1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedhet.data.splits.common import _concat, _cut, _shuffled_class_indices
from fedhet.data.splits.registry import Partition, SplitParam, _register
from fedhet.errors import ConfigError

#: Upper bound on the redraw loops of the retrying splits (Dir-class, Dir-pair); reaching it means the
#: parameters (tiny alpha, large minimum size) are practically unsatisfiable: we say so instead of hanging.
MAX_ATTEMPTS = 2_000

_ALPHA_DOC = "Dirichlet concentration; smaller is more skewed."


def _log_dirichlet(rng: np.random.Generator, concentration: np.ndarray, size: int) -> np.ndarray:
    """log of ``size`` draws of Dir(concentration), shape (size, K), exact and free of underflow.

    Uses Gamma(a) = Gamma(a + 1)·U^(1/a) in log space, so tiny concentrations (α = 0.01, where numpy's
    ``dirichlet`` returns exact zeros or NaN) keep their order; ``exp`` of a row is a Dir(concentration) draw.
    """
    concentration = np.asarray(concentration, dtype=np.float64)
    shape = (size, len(concentration))
    log_gamma = np.log(rng.standard_gamma(concentration + 1.0, size=shape))
    log_gamma += np.log1p(-rng.random(shape)) / concentration  # 1 - U lies in (0, 1]: no log(0)
    return log_gamma - _logsumexp(log_gamma, axis=1)


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return top + np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True))


def _softmax(log_weights: np.ndarray) -> np.ndarray:
    """Normalised weights from log weights (-inf = weight 0), without underflowing to an all-zero vector."""
    w = np.exp(log_weights - np.max(log_weights))
    return w / w.sum()


def _dirichlet_client_shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, alpha: float
) -> list[np.ndarray]:
    """Dir-client shards (FedFisher, baselines.md §4.1): q_i ~ Dir(α·1_K); class k cut ∝ q_{i,k}/Σ_j q_{j,k}.

    Class indices are shuffled before the cut and each shard afterwards, as in the reference. The column
    normalisation is done in log space, so at α = 0.01 a class still goes to the client(s) that weigh it
    most instead of hitting 0/0.
    """
    log_mix = _log_dirichlet(rng, np.full(num_classes, alpha), num_clients)  # (N, K)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k, idx in enumerate(_shuffled_class_indices(labels, num_classes, rng)):
        for i, piece in enumerate(_cut(idx, _softmax(log_mix[:, k]))):
            parts[i].append(piece)
    return [rng.permutation(_concat(p)) for p in parts]


def _balanced_dirichlet_cuts(
    class_idx: list[np.ndarray],
    num_workers: int,
    alpha: float,
    rng: np.random.Generator,
    capacity: float,
) -> tuple[list[list[np.ndarray]], np.ndarray]:
    """One NIID-Bench pass: per class p ~ Dir(α·1_n) over workers; p_j := 0 where worker j has >= capacity.

    Some worker is always below capacity while samples remain, so the renormalised share is well defined.
    """
    parts: list[list[np.ndarray]] = [[] for _ in range(num_workers)]
    sizes = np.zeros(num_workers, dtype=np.int64)
    for idx in class_idx:
        if len(idx) == 0:
            continue
        log_share = _log_dirichlet(rng, np.full(num_workers, alpha), 1)[0]
        log_share[sizes >= capacity] = -np.inf
        for w, piece in enumerate(_cut(idx, _softmax(log_share))):
            parts[w].append(piece)
            sizes[w] += len(piece)
    return parts, sizes


def _balanced_dirichlet_retry(
    class_idx: list[np.ndarray],
    num_workers: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int,
    failure: str,
) -> tuple[list[list[np.ndarray]], int]:
    """Redo :func:`_balanced_dirichlet_cuts` (capacity = average size) until every worker has >= ``min_size``.

    Returns (parts, attempts); ConfigError(``failure``) after MAX_ATTEMPTS draws.
    """
    capacity = sum(len(idx) for idx in class_idx) / num_workers
    for attempt in range(1, MAX_ATTEMPTS + 1):
        parts, sizes = _balanced_dirichlet_cuts(class_idx, num_workers, alpha, rng, capacity)
        if sizes.min() >= min_size:
            return parts, attempt
    raise ConfigError(failure)


@_register(
    "dirichlet-per-client",
    (SplitParam("alpha", float, 0.1, _ALPHA_DOC + " CELM uses 0.01, 0.05, 0.10.", 0.0, True),),
    doc="Dir-client (CELM / FedFisher): per-client class mixture q_i ~ Dir(alpha·1); unequal sizes.",
)
def dirichlet_per_client(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, alpha: float
) -> Partition:
    """Dir-client (baselines.md §4.1): q_i ~ Dir(α·1_K); each class cut over clients ∝ q_{i,k}/Σ_j q_{j,k}."""
    return Partition(clients=_dirichlet_client_shards(labels, num_clients, rng, num_classes, alpha))


@_register(
    "dirichlet-per-class",
    (
        SplitParam("alpha", float, 0.5, _ALPHA_DOC + " (beta in NIID-Bench).", 0.0, True),
        SplitParam("min_size", int, 10, "Redraw until every client has at least this many samples.", 0),
    ),
    doc="Dir-class (NIID-Bench labeldir): per class Dir(alpha·1), full clients get none; retry to min_size.",
)
def dirichlet_per_class(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    alpha: float,
    min_size: int,
) -> Partition:
    """Dir-class (baselines.md §4.1(a), IAFL/NIID-Bench ``noniid-labeldir``).

    Per class k: p ~ Dir(β·1_N), p_j := 0 for clients with >= total/N samples, cut ∝ p; redraw all until
    min size >= ``min_size``. Class indices are shuffled once (redraws only change the proportions, which is
    equivalent in distribution to the reference's reshuffle per redraw).
    """
    total = len(labels)
    if min_size * num_clients > total:
        raise ConfigError(
            f"split 'dirichlet-per-class': min_size={min_size} × {num_clients} clients exceeds the {total} "
            "samples; "
            f"use min_size <= {total // num_clients}"
        )
    class_idx = _shuffled_class_indices(labels, num_classes, rng)
    parts, attempt = _balanced_dirichlet_retry(
        class_idx,
        num_clients,
        alpha,
        rng,
        min_size,
        f"split 'dirichlet-per-class': no draw in {MAX_ATTEMPTS} gave every client >= min_size={min_size} "
        f"samples with alpha={alpha}; lower min_size or raise alpha",
    )
    clients = [rng.permutation(_concat(p)) for p in parts]
    return Partition(clients=clients, info={"attempts": attempt})


@_register(
    "dirichlet-prior",
    (
        SplitParam(
            "alpha",
            float,
            3.0,
            "flgo Dir(alpha·p) with p the label prior: 3.0 gives 0.3 per class on balanced 10-class data.",
            0.0,
            True,
        ),
        SplitParam(
            "tolerance", float, 1e-6, "Initial bound on ||mixture − p||² (×10 every 500 tries).", 0.0, True
        ),
    ),
    doc="Dir-flgo (FedRAC DIR(a)): equal sizes, q_i ~ Dir(a·p), mixtures resampled until they average to p.",
)
def dirichlet_prior(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    alpha: float,
    tolerance: float,
) -> Partition:
    """flgo ``DirichletPartitioner`` (baselines.md §4.3 DIR(a)), imbalance 0.

    Target sizes s_i = ⌊T/N⌋ (+1 for the first T mod N). q_i ~ Dir(a·p) over the present classes. Loop:
    stop when ||Σ_i s_i q_i / T − p||² <= tol; else take the next client (cycling in order of increasing s_i),
    draw N candidate mixtures and swap in the best one if it lowers the error; tol ×= 10 every 500 tries.
    Then class k's shuffled indices are cut ∝ q_{i,k}·s_i. Client sizes are equal up to the mixture error.
    """
    total = len(labels)
    counts = np.bincount(labels, minlength=num_classes)
    present = np.flatnonzero(counts)
    prior = counts[present] / total
    concentration = alpha * prior
    target = np.full(num_clients, total // num_clients, dtype=np.int64)
    target[: total % num_clients] += 1

    # Mixtures are kept as logs (see _log_dirichlet): flgo's NaN redraw guard is then never needed, and the
    # per-class cut below cannot hit 0/0 when every client's weight on a rare class is tiny.
    log_mix = _log_dirichlet(rng, concentration, num_clients)
    mixtures = np.exp(log_mix)
    weights = target.astype(np.float64)
    cycle = np.argsort(target, kind="stable")
    interval = 500
    max_error = tolerance
    loop_count = 0
    iterations = 0
    position = 0
    while True:
        if loop_count >= interval:
            loop_count = 0
            max_error *= 10
        mass = weights @ mixtures
        error = float((((mass / mass.sum()) - prior) ** 2).sum())
        if error <= max_error:
            break
        exc = cycle[position]
        position = (position + 1) % num_clients
        log_candidates = _log_dirichlet(rng, concentration, num_clients)
        candidates = np.exp(log_candidates)
        rest = mass - weights[exc] * mixtures[exc]
        alt = rest[None, :] + weights[exc] * candidates
        alt_err = (((alt / alt.sum(axis=1, keepdims=True)) - prior) ** 2).sum(axis=1)
        best = int(np.argmin(alt_err))
        if alt_err[best] < error:
            mixtures[exc] = candidates[best]
            log_mix[exc] = log_candidates[best]
        loop_count += 1
        iterations += 1
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    class_idx = _shuffled_class_indices(labels, num_classes, rng)
    log_weights = np.log(np.maximum(weights, 1e-300))
    for j, k in enumerate(present):
        for i, piece in enumerate(_cut(class_idx[k], _softmax(log_mix[:, j] + log_weights))):
            parts[i].append(piece)
    full_mix = np.zeros((num_clients, num_classes))
    full_mix[:, present] = mixtures
    info: dict[str, Any] = {
        "target_sizes": target.tolist(),
        "mixtures": full_mix.tolist(),
        "prior": (counts / total).tolist(),
        "mixture_error": error,
        "tolerance_used": max_error,
        "iterations": iterations,
    }
    return Partition(clients=[rng.permutation(_concat(p)) for p in parts], info=info)


@_register(
    "dirichlet-pairs",
    (SplitParam("alpha", float, 0.1, _ALPHA_DOC + " 0 means IID (SAGE clients_indices_homo).", 0.0),),
    doc="Dir-pair (SAGE/ProxyFL): Dir(alpha·1_2) in ⌈N/2⌉ random chunks of 2 workers, then N equal parts.",
)
def dirichlet_pairs(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, alpha: float
) -> Partition:
    """SAGE ``clients_indices`` (baselines.md §4.2).

    Shuffle; cut into ⌈N/2⌉ chunks of int(2/N·T) (the last takes the rest, with N − 2(⌈N/2⌉−1) workers);
    per chunk, per class Dir(α·1_2) with NIID-Bench balancing, redrawn until the smallest worker has >=
    int(0.5·chunk/2); concatenate the workers (class-ordered) and re-cut into N equal contiguous parts (the
    first T mod N get one more). α = 0: per-class equal slices ⌊c/N·n_k⌋ (``clients_indices_homo``).
    Deviation: a chunk whose threshold rounds to 0 is still split once (the reference drops it).
    """
    total = len(labels)
    if alpha == 0:
        clients: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in _shuffled_class_indices(labels, num_classes, rng):
            bounds = [math.floor(c / num_clients * len(idx)) for c in range(num_clients + 1)]
            for c in range(num_clients):
                clients[c].append(idx[bounds[c] : bounds[c + 1]])
        return Partition(clients=[_concat(c) for c in clients], info={"iid": True})
    if num_clients < 2:
        raise ConfigError(
            f"split 'dirichlet-pairs' with alpha={alpha} needs at least 2 clients (it pairs workers); "
            f"got {num_clients}. Use alpha=0 (IID) or more clients"
        )
    order = rng.permutation(total)
    num_chunks = math.ceil(num_clients / 2)
    chunk_len = int(2 / num_clients * total)
    workers_per_chunk = [2] * (num_chunks - 1) + [num_clients - 2 * (num_chunks - 1)]
    sequence: list[np.ndarray] = []
    attempts: list[int] = []
    for c, n_workers in enumerate(workers_per_chunk):
        chunk = order[c * chunk_len : (total if c == num_chunks - 1 else (c + 1) * chunk_len)]
        chunk_labels = labels[chunk]
        # Per class, in chunk (i.e. shuffled) order, as the reference's np.where over the chunk.
        class_idx = [chunk[np.flatnonzero(chunk_labels == k)] for k in range(num_classes)]
        need = int(0.50 * len(chunk) / n_workers)
        parts, attempt = _balanced_dirichlet_retry(
            class_idx,
            n_workers,
            alpha,
            rng,
            need,
            f"split 'dirichlet-pairs': chunk {c} found no draw in {MAX_ATTEMPTS} with every worker >= {need} "
            f"samples at alpha={alpha}; raise alpha",
        )
        attempts.append(attempt)
        sequence.extend(_concat(p) for p in parts)
    flat = _concat(sequence)
    per, extra = divmod(len(flat), num_clients)
    sizes_out = [per + 1 if i < extra else per for i in range(num_clients)]
    bounds = np.concatenate([[0], np.cumsum(sizes_out)])
    clients_out = [flat[bounds[i] : bounds[i + 1]] for i in range(num_clients)]
    return Partition(clients=clients_out, info={"attempts": attempts})
