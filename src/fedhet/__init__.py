"""fedhet: federated learning across heterogeneous clients (CELM, FedRAC, ProxyFL and their baselines).

The Python API (the same experiments as the ``fedhet`` command)::

    import fedhet
    result = fedhet.run("celm/fmnist-maverick", overrides={"train.rounds": 5})
    table = fedhet.compare("celm/fmnist-maverick", methods=["fedavg", "celm"], seeds=[0, 1])

Names are imported on first use, so ``import fedhet`` stays light.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = {
    "run": "fedhet.api",
    "compare": "fedhet.api",
    "RunResult": "fedhet.api",
    "CompareResult": "fedhet.api",
    "load_config": "fedhet.config",
    "ExperimentConfig": "fedhet.config",
    "experiment_names": "fedhet.config",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'fedhet' has no attribute {name!r}")
