"""Registered federated methods: name -> strategy class (imported lazily, one file per method)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any

from fedhet.errors import ConfigError

#: method name -> "module:StrategyClass"
ALGORITHMS: dict[str, str] = {
    "fedavg": "fedhet.algorithms.fedavg:FedAvg",
    "standalone": "fedhet.algorithms.standalone:Standalone",
    # contribution estimation (CELM) and its client-loss add-on
    "celm": "fedhet.algorithms.celm:CELM",
    "celm-rs": "fedhet.algorithms.celm:CELMRS",
    "fedrs": "fedhet.algorithms.fedrs:FedRS",
    # contribution / fairness baselines
    "cffl": "fedhet.algorithms.cffl:CFFL",
    "cgsv": "fedhet.algorithms.cgsv:CGSV",
    "shapfed": "fedhet.algorithms.shapfed:ShapFed",
    "iafl": "fedhet.algorithms.iafl:IAFL",
    # collaborative fairness by submodels
    "fedrac": "fedhet.algorithms.fedrac:FedRAC",
    "fedrac-data-free": "fedhet.algorithms.fedrac:FedRACDataFree",
    "fedrac-fixed-ratio": "fedhet.algorithms.fedrac:FedRACFixedRatio",
    "fedrac-random-masks": "fedhet.algorithms.fedrac:FedRACRandomMasks",
    "fedrac-strict": "fedhet.algorithms.fedrac:FedRACStrictSizes",
    "fedsac": "fedhet.algorithms.fedsac:FedSAC",
    # federated semi-supervised learning
    "fedavg-labeled": "fedhet.algorithms.fixmatch:LabeledOnly",
    "fedprox": "fedhet.algorithms.fedprox:FedProx",
    "fedprox-labeled": "fedhet.algorithms.fedprox:FedProxLabeled",
    "fedavg-full": "fedhet.algorithms.fixmatch:FullySupervised",
    "fixmatch-lpl": "fedhet.algorithms.fixmatch:FixMatchLPL",
    "fixmatch-gpl": "fedhet.algorithms.fixmatch:FixMatchGPL",
    "fedprox-fixmatch": "fedhet.algorithms.fedprox:FedProxFixMatch",
    "sage": "fedhet.algorithms.sage:SAGE",
    "proxyfl": "fedhet.algorithms.proxyfl:ProxyFL",
    "fedproto-fssl": "fedhet.algorithms.fedproto:FedProtoFSSL",
}


#: method name -> a strategy class registered at run time (``register``) or by an installed package
_REGISTERED: dict[str, type] = {}


def register(strategy_class: type, name: str | None = None, *, overwrite: bool = False) -> str:
    """Make ``method.name = name`` run ``strategy_class`` (a subclass of ``fedhet.algorithms.fedavg.FedAvg``,
    or of ``fedhet.engine.protocol.Strategy``); ``name`` defaults to the class's ``name`` attribute.

    Registration lives in this process: for ``fedhet compare --jobs N`` register at import time of the
    calling script, or advertise the class in the ``fedhet.methods`` entry-point group. Returns the name.
    """
    from fedhet.engine.protocol import Strategy, Trainer

    if not (inspect.isclass(strategy_class) and issubclass(strategy_class, Strategy)):
        raise ConfigError(
            f"algorithms.register: {strategy_class!r} is not a Strategy subclass; subclass "
            "fedhet.algorithms.fedavg.FedAvg and override the hooks your method changes"
        )
    trainer = getattr(strategy_class, "trainer_class", None)
    if not (inspect.isclass(trainer) and issubclass(trainer, Trainer)):
        raise ConfigError(
            f"{strategy_class.__name__}.trainer_class must be a Trainer subclass, got {trainer!r}"
        )
    name = name or getattr(strategy_class, "name", None)
    if not isinstance(name, str) or not name.strip() or "/" in name or name in ("strategy", "fedavg-base"):
        raise ConfigError(
            f"algorithms.register({strategy_class.__name__}): give a method name (name=... or a class "
            f"attribute name = '...'), not {name!r}"
        )
    if name in ALGORITHMS:
        raise ConfigError(
            f"{name!r} is a built-in method; give {strategy_class.__name__} its own name (a class attribute "
            "name = '...', or register(cls, name='...'))"
        )
    if name in _REGISTERED and _REGISTERED[name] is not strategy_class and not overwrite:
        raise ConfigError(f"a method named {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTERED[name] = strategy_class
    return name


def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {p.name: p for p in entry_points(group="fedhet.methods")}


def describe(name: str) -> str:
    """One line about method ``name``: its strategy's docstring's first line."""
    doc = (strategy_class(name).__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def _module_exists(name: str) -> bool:
    return importlib.util.find_spec(ALGORITHMS[name].partition(":")[0]) is not None


def method_names() -> list[str]:
    """Built-in methods whose module is present, registered ones, and installed packages' (entry points)."""
    return sorted({n for n in ALGORITHMS if _module_exists(n)} | set(_REGISTERED) | set(_entry_points()))


def strategy_class(name: str) -> type:
    """The strategy class registered under ``name``."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in ALGORITHMS or not _module_exists(name):
        point = _entry_points().get(name)
        if point is None:
            raise ConfigError(f"method.name={name!r} is not a known method; choose one of {method_names()}")
        register(point.load(), name)
        return _REGISTERED[name]
    module, _, cls = ALGORITHMS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def _keyword_params(function: Any) -> tuple[list[str], bool]:
    """The parameters ``function`` takes by keyword, and whether it also takes ``**kwargs``."""
    sig = inspect.signature(function)
    names = [
        p
        for p in sig.parameters
        if p != "self"
        and sig.parameters[p].kind
        in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    return names, any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def accepted_params(cls: type) -> list[str]:
    """Constructor parameters a strategy accepts (walking up **kwargs-forwarding subclasses; a class whose
    **kwargs go to a component instead names it in ``forwards_params_to``, e.g. CELM's estimator)."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        own, forwards = _keyword_params(init)
        names += own
        if forwards and "forwards_params_to" in klass.__dict__:
            names += _keyword_params(klass.__dict__["forwards_params_to"])[0]
            break
        if not forwards:
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
    strategy = cls(**params)
    if name in _REGISTERED:
        strategy.name = name  # the registered name is the one runs and reports show
    return strategy
