"""Splits that plant a known contributor for CELM's contribution estimates: the maverick clients that
alone hold rare classes, and the free rider (methods.md §1.2, baselines.md §1.4, §4.5).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedhet.data.splits.common import _concat
from fedhet.data.splits.dirichlet import _dirichlet_client_shards
from fedhet.data.splits.registry import (
    SPLITS,
    Partition,
    SplitParam,
    _jsonable,
    _register,
    validate_split_params,
)
from fedhet.errors import ConfigError

_MAVERICK_BASES = (
    "iid",
    "dirichlet-per-client",
    "dirichlet-per-class",
    "dirichlet-prior",
    "dirichlet-pairs",
    "step-quantity",
)


@_register(
    "maverick",
    (
        SplitParam("rare_classes", list, [0], "Classes held only by the maverick clients (R).", 0),
        SplitParam(
            "rare_fraction",
            float,
            0.1,
            "Fraction of each rare class's samples kept (the rest unused).",
            0.0,
            True,
            1.0,
        ),
        SplitParam("maverick_clients", list, [0], "Clients that exclusively hold the rare classes (M).", 0),
        SplitParam(
            "base",
            str,
            "iid",
            "Split of the other classes over all clients; its parameters go as base_<name>, e.g. base_alpha.",
            choices=_MAVERICK_BASES,
        ),
    ),
    doc="Maverick (CELM [ours]): rare classes, thinned to rare_fraction, go evenly to the maverick clients "
    "only; "
    "other classes by the base split over all clients.",
    bases=_MAVERICK_BASES,
)
def maverick(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    rare_classes: list[int],
    rare_fraction: float,
    maverick_clients: list[int],
    base: str,
    **base_params: Any,
) -> Partition:
    """Maverick (methods.md §1.2 [ours], baselines.md §4.5): keep round(f·n_r) random samples of each rare
    class r, split evenly (``array_split``) among the maverick clients; the other classes follow ``base``."""
    bad_classes = [c for c in rare_classes if c >= num_classes]
    if bad_classes:
        raise ConfigError(
            f"split 'maverick': rare_classes {bad_classes} do not exist; classes are 0..{num_classes - 1}"
        )
    bad_clients = [c for c in maverick_clients if c >= num_clients]
    if bad_clients:
        raise ConfigError(
            f"split 'maverick': maverick_clients {bad_clients} do not exist; clients are 0..{num_clients - 1}"
        )
    rare_mask = np.isin(labels, rare_classes)
    others = np.flatnonzero(~rare_mask)
    if len(others) < num_clients:
        raise ConfigError(
            f"split 'maverick': only {len(others)} samples outside rare_classes={rare_classes} for "
            f"{num_clients} clients; choose fewer rare classes"
        )
    extra: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    kept: dict[str, int] = {}
    for r in rare_classes:
        idx = np.flatnonzero(labels == r)
        n_keep = int(round(rare_fraction * len(idx)))
        chosen = rng.choice(idx, size=n_keep, replace=False)
        kept[str(r)] = n_keep
        for m, piece in zip(maverick_clients, np.array_split(chosen, len(maverick_clients)), strict=True):
            extra[m].append(piece)
    inner = {k[5:]: v for k, v in base_params.items() if k.startswith("base_")}
    inner = validate_split_params(base, inner)
    base_part = SPLITS[base].fn(labels[others], num_clients, rng, num_classes, **inner)
    clients = [
        rng.permutation(_concat([others[base_part.clients[i]], *extra[i]])) for i in range(num_clients)
    ]
    info = {
        "rare_classes": list(rare_classes),
        "maverick_clients": list(maverick_clients),
        "rare_kept": kept,
        "base": base,
        "base_info": _jsonable(base_part.info),
    }
    return Partition(clients=clients, info=info)


@_register(
    "free-rider",
    (
        SplitParam("alpha", float, 1.0, "Dir-client concentration of the underlying split.", 0.0, True),
        SplitParam("free_rider", int, 0, "Index of the free-rider client.", 0),
        SplitParam("actual_size", int, 10, "Distinct samples the free rider really holds.", 1),
    ),
    doc="Free rider (CELM / spectralfuse): Dir-client split; the free rider keeps actual_size distinct "
    "samples, "
    "repeated up to the mean size of the others.",
)
def free_rider(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    alpha: float,
    free_rider: int,
    actual_size: int,
) -> Partition:
    """Free-rider split (baselines.md §1.4, methods.md §1.2).

    Dir-client(α) shards; the free rider keeps ``actual_size`` distinct samples of its shard (all of them if
    it has fewer; drawn from the whole pool if its shard is empty, then they overlap other clients), tiled
    to size ⌊mean size of the others⌋. (The reference draws its 10 with replacement; methods.md says
    distinct, which we follow.) The rest of its shard is unused.
    """
    if num_clients < 2:
        raise ConfigError(
            f"split 'free-rider' needs at least 2 clients (a free rider and others), got {num_clients}"
        )
    if free_rider >= num_clients:
        raise ConfigError(
            f"split 'free-rider': free_rider={free_rider} does not exist; clients are 0..{num_clients - 1}"
        )
    shards = _dirichlet_client_shards(labels, num_clients, rng, num_classes, alpha)
    shard = shards[free_rider]
    if len(shard) >= actual_size:
        kept, source = rng.choice(shard, size=actual_size, replace=False), "shard"
    elif len(shard) > 0:
        kept, source = shard, "shard (smaller than actual_size: all of it)"
    else:
        kept = rng.choice(len(labels), size=min(actual_size, len(labels)), replace=False)
        source = "pool (its shard was empty; these samples also belong to other clients)"
    others = [len(s) for i, s in enumerate(shards) if i != free_rider]
    size = int(np.mean(others))
    shards[free_rider] = np.resize(kept, size) if size > 0 else kept[:0]
    info = {
        "free_rider": free_rider,
        "free_rider_distinct": int(len(np.unique(shards[free_rider]))),
        "free_rider_size": size,
        "free_rider_shard_size": int(len(shard)),
        "free_rider_source": source,
    }
    return Partition(clients=shards, info=info)
