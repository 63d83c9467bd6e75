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


@_register(
    "duplicate",
    (
        SplitParam(
            "alpha", float, 1.0, "Dir-class concentration of the split over the other clients.", 0.0, True
        ),
        SplitParam("source", int, 0, "The client whose samples are copied.", 0),
        SplitParam("copy", int, 1, "The client that holds an exact copy of the source's samples.", 0),
    ),
    doc="Duplicate (a planted role for contribution estimates): a dirichlet-per-class split over N − 1 "
    "clients; client copy holds exactly the samples of client source (its data adds nothing the source's "
    "does not).",
)
def duplicate(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    alpha: float,
    source: int,
    copy: int,
) -> Partition:
    """Dirichlet-per-class(α) shards for the N − 1 clients other than ``copy`` (in client order), then
    ``copy`` gets the same index array as ``source``: two clients, one dataset. Exact Shapley gives them
    equal values; leave-one-out gives each about 0, since the other still holds the data."""
    if num_clients < 3:
        raise ConfigError(
            f"split 'duplicate' needs at least 3 clients (a source, its copy, another), got {num_clients}"
        )
    bad = [c for c in (source, copy) if c >= num_clients]
    if bad:
        raise ConfigError(
            f"split 'duplicate': client(s) {bad} do not exist; clients are 0..{num_clients - 1}"
        )
    if source == copy:
        raise ConfigError(f"split 'duplicate': source and copy are both client {source}; choose two clients")
    shards = iter(
        SPLITS["dirichlet-per-class"]
        .fn(labels, num_clients - 1, rng, num_classes, alpha=alpha, min_size=10)
        .clients
    )
    clients = [np.empty(0, dtype=np.int64) if i == copy else next(shards) for i in range(num_clients)]
    clients[copy] = clients[source].copy()
    return Partition(clients=clients, info={"duplicate": {"source": source, "copy": copy}})
