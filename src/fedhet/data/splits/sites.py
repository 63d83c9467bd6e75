"""The data's own client layout: a table whose rows name their client (a client column, or one file per
client), as a cross-silo federation holds it: client i keeps the rows of site i (sites sorted by name).
"""

from __future__ import annotations

import numpy as np

from fedhet.data.splits.registry import Partition, _register
from fedhet.errors import ConfigError


@_register(
    "sites",
    doc="The data's own layout: client i holds the rows its client column (or file) names as site i, sites "
    "in sorted order; data.clients must equal the number of sites.",
    needs_sites=True,
)
def sites(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, *, site_of: np.ndarray
) -> Partition:
    """Each client's rows, in their order in the data; ``site_of`` gives each row's site index."""
    site_of = np.asarray(site_of, dtype=np.int64)
    present = int(site_of.max()) + 1 if site_of.size else 0
    if num_clients != present:
        raise ConfigError(
            f"split 'sites': the data name {present} clients but data.clients = {num_clients}; set "
            f"data.clients = {present}"
        )
    clients = [np.flatnonzero(site_of == s) for s in range(num_clients)]
    empty = [s for s, rows in enumerate(clients) if rows.size == 0]
    if empty:
        raise ConfigError(
            f"split 'sites': client(s) {empty} hold no training rows (after the validation hold-out or "
            "max_train_samples); lower data.validation_fraction or drop those sites"
        )
    return Partition(clients, info={"sites": num_clients})
