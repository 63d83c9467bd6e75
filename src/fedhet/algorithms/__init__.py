"""Registered federated methods: name -> strategy class (imported lazily, one file per method)."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from fedhet.errors import ConfigError

#: method name -> "module:StrategyClass"
ALGORITHMS: dict[str, str] = {
    "fedavg": "fedhet.algorithms.fedavg:FedAvg",
    "standalone": "fedhet.algorithms.standalone:Standalone",
}


def method_names() -> list[str]:
    return sorted(ALGORITHMS)


def strategy_class(name: str) -> type:
    """The strategy class registered under ``name``."""
    if name not in ALGORITHMS:
        raise ConfigError(f"method.name={name!r} is not a known method; choose one of {method_names()}")
    module, _, cls = ALGORITHMS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def accepted_params(cls: type) -> list[str]:
    """Constructor parameters a strategy accepts (walking up **kwargs-forwarding subclasses)."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        sig = inspect.signature(init)
        names += [
            p
            for p in sig.parameters
            if p != "self"
            and sig.parameters[p].kind
            in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
            break
    return sorted(set(names))


def build_strategy(name: str, params: dict[str, Any] | None = None) -> Any:
    """Instantiate method ``name`` with ``params``; unknown parameters are a ConfigError."""
    cls = strategy_class(name)
    params = dict(params or {})
    accepted = accepted_params(cls)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(f"method {name!r} has no parameter(s) {unknown}; accepted: {accepted}")
    return cls(**params)
