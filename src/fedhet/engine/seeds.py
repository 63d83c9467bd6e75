"""Every random choice of a run flows from its seed through a generator derived for one purpose.

The partition, the client sample of a round, each client's batches in a round, the server's own generator:
each draws from a stream that depends only on (seed, purpose, keys), so results do not depend on the order
in which clients run, nor on the transport that carries their messages.
"""

from __future__ import annotations

import numpy as np
import torch

PURPOSE = {
    "partition": 1,
    "subset": 2,
    "validation": 3,
    "sampling": 4,
    "dropout": 5,
    "client": 6,
    "strategy": 7,
    "model": 8,
    "test_subset": 9,
    "fault": 10,
    "estimates": 11,
}


def derived_rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """A numpy generator for one purpose (and round/client), independent of every other stream."""
    return np.random.default_rng([seed, PURPOSE[purpose], *keys])


def derived_torch_generator(seed: int, purpose: str, *keys: int) -> torch.Generator:
    """A CPU torch generator for one purpose (and round/client)."""
    state = np.random.SeedSequence([seed, PURPOSE[purpose], *keys]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def model_seed(seed: int) -> int:
    """The torch seed the initial model of a run is drawn with (the same on every process)."""
    return int(np.random.SeedSequence([seed, PURPOSE["model"]]).generate_state(1)[0])
