"""Quantity and label skew without Dirichlet draws: POW and CLA (CGSV/CFFL/FedRAC, baselines.md §4.3), PLS,
SLS and step quantity (spectralfuse, baselines.md §4.4).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedhet.data.splits.common import _concat, _shuffled_class_indices
from fedhet.data.splits.registry import Partition, SplitParam, _register
from fedhet.errors import ConfigError, DataError

#: The scipy ``powerlaw`` shape of CGSV/CFFL/FedRAC's POW split (baselines.md §4.3).
POWERLAW_SHAPE = 1.65911332899


def _labels_per_client(min_labels: int, num_clients: int, num_classes: int) -> list[int]:
    """m_i = m_min + i·⌊(K − m_min)/(N − 1)⌋ (SLS/PLS v2, baselines.md §4.4); N = 1 gives m_min."""
    if min_labels > num_classes:
        raise ConfigError(
            f"min_labels={min_labels} exceeds the {num_classes} classes; use min_labels <= {num_classes}"
        )
    step = (num_classes - min_labels) // (num_clients - 1) if num_clients > 1 else 0
    return [min_labels + i * step for i in range(num_clients)]


def _pow_sizes(num_clients: int, total: int) -> list[int]:
    """POW shard sizes: ⌈b_i/Σb·T⌉, b = linspace(F⁻¹(0.01), F⁻¹(0.99), N), F = scipy powerlaw(a = 1.659...).

    F(x) = x^a on [0, 1], so F⁻¹(q) = q^(1/a) (computed directly; equal to scipy's ``powerlaw.ppf``). The
    ceilings overshoot T by up to N−1; the excess is removed one sample at a time from the currently largest
    shard (the first of ties), which keeps sizes non-decreasing. For N <= 85 this is exactly the reference,
    whose final slice simply comes up short on the last shard.
    """
    b = np.linspace(0.01 ** (1 / POWERLAW_SHAPE), 0.99 ** (1 / POWERLAW_SHAPE), num_clients)
    sizes = np.array([math.ceil(x) for x in b / b.sum() * total], dtype=np.int64)
    for _ in range(int(sizes.sum()) - total):
        sizes[int(np.argmax(sizes))] -= 1
    return sizes.tolist()


@_register(
    "pow",
    (
        SplitParam(
            "samples_per_client",
            int,
            2000,
            "Mean shard size; uses the first samples_per_client·N samples of a random permutation.",
            1,
        ),
    ),
    doc="POW (CGSV/CFFL/FedRAC): powerlaw quantile ramp of shard sizes over samples_per_client·N samples.",
)
def pow_split(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, samples_per_client: int
) -> Partition:
    """POW (baselines.md §4.3): contiguous blocks of a random permutation, sizes from the powerlaw ramp."""
    total = samples_per_client * num_clients
    if total > len(labels):
        raise ConfigError(
            f"split 'pow': samples_per_client={samples_per_client} × {num_clients} clients = {total} "
            "exceeds the "
            f"{len(labels)} samples; use samples_per_client <= {len(labels) // num_clients}"
        )
    chosen = rng.permutation(len(labels))[:total]
    sizes = _pow_sizes(num_clients, total)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return Partition(
        clients=[chosen[bounds[i] : bounds[i + 1]] for i in range(num_clients)], info={"sizes": sizes}
    )


@_register(
    "cla",
    (SplitParam("samples_per_client", int, 2000, "Samples per client (all clients equal).", 1),),
    doc="CLA (CGSV/CFFL/FedRAC): client i has classes 0..k_i-1, k_i = int(linspace(1, K, N))_i, drawn with "
    "replacement.",
)
def cla(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, samples_per_client: int
) -> Partition:
    """CLA / ``classimbalance`` (baselines.md §4.3).

    Per class c < k_i: ⌊S/k_i⌋ draws with replacement from the class's remaining pool; then top up to S from
    class k_i − 1 without replacement (those samples leave the pool for later clients, as in the reference).
    """
    class_sizes = np.linspace(1, num_classes, num_clients).astype(int)
    pools = _shuffled_class_indices(labels, num_classes, rng)
    offsets = [0] * num_classes
    clients = []
    for i, k_i in enumerate(class_sizes):
        per_class = samples_per_client // int(k_i)
        parts = []
        for c in range(int(k_i)):
            pool = pools[c][offsets[c] :]
            if len(pool) == 0:
                raise DataError(
                    f"split 'cla': class {c} has no samples left for client {i}; it needs class {c}"
                )
            parts.append(pool[rng.integers(0, len(pool), size=per_class)])
        extra = samples_per_client - per_class * int(k_i)
        last = int(k_i) - 1
        pool = pools[last][offsets[last] :]
        if extra > len(pool):
            raise DataError(
                f"split 'cla': class {last} has {len(pool)} samples left, client {i} needs {extra}"
            )
        parts.append(pool[:extra])
        offsets[last] += extra
        clients.append(_concat(parts))
    return Partition(clients=clients, info={"classes_per_client": class_sizes.tolist()})


def _label_skew_check(params: dict[str, Any]) -> None:
    if params["max_samples_per_label"] < params["min_samples_per_label"]:
        raise ConfigError(
            f"split 'pure-label-skew': max_samples_per_label={params['max_samples_per_label']} is below "
            f"min_samples_per_label={params['min_samples_per_label']}; it must be >= it"
        )


_MIN_LABELS = SplitParam(
    "min_labels", int, 2, "m_min: labels of client 0 (spec default 2 for CIFAR-10/F-MNIST).", 1
)


@_register(
    "pure-label-skew",
    (
        _MIN_LABELS,
        SplitParam("min_samples_per_label", int, 100, "min_spl (spec default 100).", 1),
        SplitParam(
            "max_samples_per_label",
            int,
            3000,
            "max_spl: 3000 for F/MNIST (default), 2000 for CIFAR-10, "
            "400 for CIFAR-100; set it per dataset in the config.",
            1,
        ),
    ),
    doc="PLS (CELM, spectralfuse only_label_skew v2): per-client label sets, then all clients subsampled "
    "to the smallest size.",
    check=_label_skew_check,
)
def pure_label_skew(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    min_labels: int,
    min_samples_per_label: int,
    max_samples_per_label: int,
) -> Partition:
    """PLS v2 (baselines.md §4.4). Client i in order picks m_i random labels and, per label, takes
    min(n_i, left) unused samples, n_i = min_spl + (N − i)·⌊(max_spl − min_spl)/N⌋, skipping labels with
    < min_spl left, stopping once its total exceeds m_min·max_spl; finally all are subsampled to the smallest.
    """
    targets = _labels_per_client(min_labels, num_clients, num_classes)
    step = (max_samples_per_label - min_samples_per_label) // num_clients
    per_label = [min_samples_per_label + (num_clients - i) * step for i in range(num_clients)]
    pools = _shuffled_class_indices(labels, num_classes, rng)
    used = [0] * num_classes
    cap = min_labels * max_samples_per_label
    raw: list[np.ndarray] = []
    chosen_labels: list[list[int]] = []
    for i in range(num_clients):
        chosen = rng.choice(num_classes, size=targets[i], replace=False)
        chosen_labels.append([int(c) for c in chosen])
        parts: list[np.ndarray] = []
        count = 0
        for c in chosen:
            left = len(pools[c]) - used[c]
            if left < min_samples_per_label:
                continue
            take = min(per_label[i], left)
            parts.append(pools[c][used[c] : used[c] + take])
            used[c] += take
            count += take
            if count > cap:
                break
        raw.append(rng.permutation(_concat(parts)))
    smallest = min(len(r) for r in raw)
    if smallest == 0:
        empty = [i for i, r in enumerate(raw) if len(r) == 0]
        raise ConfigError(
            f"split 'pure-label-skew': clients {empty} got no samples (their labels were used up); lower "
            f"max_samples_per_label={max_samples_per_label} or min_samples_per_label={min_samples_per_label}"
        )
    clients = [rng.choice(r, size=smallest, replace=False) for r in raw]
    info = {
        "target_labels": targets,
        "target_samples_per_label": per_label,
        "chosen_labels": chosen_labels,
        "raw_sizes": [int(len(r)) for r in raw],
        "final_size": int(smallest),
    }
    return Partition(clients=clients, info=info)


@_register(
    "step-label-skew",
    (_MIN_LABELS,),
    doc="SLS (CELM, spectralfuse step_label_skew v2): client i has m_min + i·⌊(K−m_min)/(N−1)⌋ labels; "
    "each label split equally among its holders.",
)
def step_label_skew(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, min_labels: int
) -> Partition:
    """SLS v2 (baselines.md §4.4): random label sets of growing size; each label's full index set is split
    equally (``array_split``, in client order) among the clients holding it; unchosen labels are unused."""
    targets = _labels_per_client(min_labels, num_clients, num_classes)
    chosen = [set(int(c) for c in rng.choice(num_classes, size=m, replace=False)) for m in targets]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k, idx in enumerate(_shuffled_class_indices(labels, num_classes, rng)):
        holders = [i for i in range(num_clients) if k in chosen[i]]
        if not holders:
            continue
        for i, piece in zip(holders, np.array_split(idx, len(holders)), strict=True):
            parts[i].append(piece)
    clients = [rng.permutation(_concat(p)) for p in parts]
    info = {"target_labels": targets, "chosen_labels": [sorted(c) for c in chosen]}
    return Partition(clients=clients, info=info)


@_register(
    "step-quantity",
    (
        SplitParam(
            "gamma", float, 0.05, "gamma: share step between consecutive clients; |gamma| < 2/(N(N−1)).", None
        ),
    ),
    doc="Step quantity (spectralfuse): all labels, client i gets share 1/N − (N−1)γ/2 + iγ of each label.",
)
def step_quantity(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, gamma: float
) -> Partition:
    """``step_quantity`` (baselines.md §4.4): per label, client i draws ⌊(1/N − (N−1)γ/2 + iγ)·n_k⌋ samples
    without replacement; the reference's assertion |γ| < 2/(N(N−1)) is a ConfigError here."""
    if num_clients > 1 and not abs(gamma) < 2 / (num_clients * (num_clients - 1)):
        limit = 2 / (num_clients * (num_clients - 1))
        raise ConfigError(
            f"split 'step-quantity': gamma={gamma} needs |gamma| < 2/(N(N-1)) = {limit:.6g} "
            f"for N={num_clients} "
            f"(else client 0's share 1/N - (N-1)gamma/2 is not positive); use e.g. gamma={limit / 2:.4g}"
        )
    ratios = 1 / num_clients - (num_clients - 1) / 2 * gamma + gamma * np.arange(num_clients)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for idx in _shuffled_class_indices(labels, num_classes, rng):
        lens = np.floor(ratios * len(idx)).astype(np.int64)
        bounds = np.concatenate([[0], np.cumsum(lens)])
        for i in range(num_clients):
            parts[i].append(idx[bounds[i] : bounds[i + 1]])
    return Partition(clients=[rng.permutation(_concat(p)) for p in parts], info={"shares": ratios.tolist()})
