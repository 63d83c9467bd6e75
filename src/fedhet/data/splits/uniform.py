"""The uniform split (UNI): equal random shards, the baseline every skewed split departs from."""

from __future__ import annotations

import numpy as np

from fedhet.data.splits.registry import Partition, _register


@_register("iid", doc="Equal random shards (UNI; sizes differ by at most 1).")
def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int) -> Partition:
    """UNI (baselines.md §4.6): a random permutation cut into N near-equal shards (``np.array_split``)."""
    return Partition(clients=np.array_split(rng.permutation(len(labels)), num_clients))
