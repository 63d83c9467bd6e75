"""The federated semi-supervised split (SAGE/ProxyFL): a few labels per class, labeled and unlabeled
pools split separately (methods.md §2.2, baselines.md §3.1).
"""

from __future__ import annotations

import numpy as np

from fedhet.data.splits.common import _class_indices, _concat
from fedhet.data.splits.dirichlet import dirichlet_pairs
from fedhet.data.splits.registry import Partition, SplitParam, _jsonable, _register
from fedhet.data.splits.uniform import iid
from fedhet.errors import ConfigError


@_register(
    "labeled-unlabeled",
    (
        SplitParam(
            "labeled_per_class",
            int,
            500,
            "Labeled samples per class (CIFAR-10 500, CIFAR-100 50, SVHN 460, CINIC-10 900).",
            1,
        ),
        SplitParam(
            "alpha", float, 0.1, "Dir-pair concentration of the base split (0 = IID); unused by 'iid'.", 0.0
        ),
        SplitParam(
            "base",
            str,
            "dirichlet-pairs",
            "Split applied separately to the labeled and unlabeled pools.",
            choices=("dirichlet-pairs", "iid"),
        ),
        SplitParam(
            "labeled_clients",
            list,
            None,
            "Only these clients hold labels (default: every client). The same labeled pool is split over "
            "them alone; the others hold unlabeled data only.",
            0,
        ),
    ),
    doc="FSSL (SAGE/ProxyFL): labeled_per_class labels per class; labeled and unlabeled pools split "
    "separately; "
    "each client's labeled samples appended to its unlabeled set.",
)
def labeled_unlabeled(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    labeled_per_class: int,
    alpha: float,
    base: str,
    labeled_clients: list[int] | None = None,
) -> Partition:
    """SAGE/ProxyFL protocol (methods.md §2.2, baselines.md §3.1). ``clients`` = labeled indices;
    ``unlabeled[i]`` = client i's unlabeled indices followed by (at the end) a copy of its labeled ones.

    With ``labeled_clients`` [ours, beyond ProxyFL's "every client holds labels"], the labeled pool is split
    over the listed clients only, so the label budget stays labeled_per_class·K wherever the labels sit; the
    other clients' labeled sets are empty.
    """
    holders = list(range(num_clients)) if labeled_clients is None else sorted(labeled_clients)
    outside = [c for c in holders if c >= num_clients]
    if outside:
        raise ConfigError(
            f"split 'labeled-unlabeled': labeled_clients {outside} are not clients of a {num_clients}-client "
            f"federation; use ids 0..{num_clients - 1}"
        )
    labeled_parts = []
    for k, idx in enumerate(_class_indices(labels, num_classes)):
        if len(idx) == 0:
            continue
        if len(idx) < labeled_per_class:
            raise ConfigError(
                f"split 'labeled-unlabeled': class {k} has {len(idx)} samples, fewer than labeled_per_class="
                f"{labeled_per_class}; use labeled_per_class <= {len(idx)}"
            )
        labeled_parts.append(rng.permutation(idx)[:labeled_per_class])
    labeled = np.sort(_concat(labeled_parts))
    unlabeled = np.setdiff1d(np.arange(len(labels)), labeled)
    for pool, what, count in ((labeled, "labeled", len(holders)), (unlabeled, "unlabeled", num_clients)):
        if len(pool) < count:
            raise ConfigError(
                f"split 'labeled-unlabeled': the {what} pool has {len(pool)} samples for {count} "
                "clients; "
                "change labeled_per_class or use fewer clients"
            )

    def split(pool: np.ndarray, count: int) -> Partition:
        if count == 1:  # one holder takes the whole pool; Dir-pairs needs two workers to pair
            return Partition(clients=[np.arange(len(pool))])
        if base == "iid":
            return iid(labels[pool], count, rng, num_classes)
        return dirichlet_pairs(labels[pool], count, rng, num_classes, alpha)

    lab_part = split(labeled, len(holders))
    unl_part = split(unlabeled, num_clients)
    clients = [labeled[:0] for _ in range(num_clients)]
    for holder, part in zip(holders, lab_part.clients, strict=True):
        clients[holder] = labeled[part]
    unl = [_concat([unlabeled[u], clients[i]]) for i, u in enumerate(unl_part.clients)]
    info = {
        "labeled_per_class": labeled_per_class,
        "num_labeled": int(len(labeled)),
        "num_unlabeled": int(len(unlabeled)),
        "base": base,
        "labeled_info": _jsonable(lab_part.info),
        "unlabeled_info": _jsonable(unl_part.info),
    }
    if labeled_clients is not None:
        info["labeled_clients"] = holders
    return Partition(clients=clients, unlabeled=unl, info=info)
