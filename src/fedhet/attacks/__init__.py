"""Registered attacks (``[faults] clients``): name -> attack class, imported lazily, one file per attack.

An attack is a small class (:class:`fedhet.attacks.base.Attack`) that declares its ``kind`` and its
parameters with their defaults; the engine (fedhet.engine.faults) calls it through this registry and knows
no attack by name. Your own: ``fedhet.attacks.register(MyAttack)`` in the running process, or a class
advertised in the ``fedhet.attacks`` entry-point group (docs/writing-an-attack.md). This module imports no
torch: the config validation reads the names from it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from fedhet.errors import ConfigError

#: attack name -> "module:Class"
BUILT_IN: dict[str, str] = {
    # on one client's reply
    "noise": "fedhet.attacks.noise:Noise",
    "scale": "fedhet.attacks.scale:Scale",
    "sign-flip": "fedhet.attacks.sign_flip:SignFlip",
    "stale": "fedhet.attacks.stale:Stale",
    "nan": "fedhet.attacks.nan:NaNWeights",
    # on its described sample count
    "lie-num-examples": "fedhet.attacks.lie_num_examples:LieNumExamples",
    # refuses to reply
    "crash": "fedhet.attacks.refusals:Crash",
    "drop": "fedhet.attacks.refusals:Drop",
    # on its training data
    "label-flip": "fedhet.attacks.label_flip:LabelFlip",
    # on one client's reply (free riders)
    "free-rider": "fedhet.attacks.noise:FreeRider",
    "replay": "fedhet.attacks.replay:Replay",
    # coordinated: the round's replies, with the honest updates in view
    "alie": "fedhet.attacks.alie:ALIE",
    "ipm": "fedhet.attacks.ipm:IPM",
    "adaptive-scale": "fedhet.attacks.adaptive_scale:AdaptiveScale",
    "min-max": "fedhet.attacks.min_max:MinMax",
    "min-sum": "fedhet.attacks.min_sum:MinSum",
    "mimic": "fedhet.attacks.mimic:Mimic",
    "inf": "fedhet.attacks.inf:Inf",
}

#: The kinds of attack, by where it acts (:class:`fedhet.attacks.base.Attack`).
KINDS = ("reply", "data", "refuse", "count", "coordinated")

#: attack name -> a class registered at run time (``register``) or loaded from an installed package
_REGISTERED: dict[str, type] = {}

#: The [faults] keys every attack may read beside its own block ``faults.params.<name>``: the flat keys the
#: built-in attacks have always read (their fingerprints stay as they were).
FLAT_KEYS = ("factor", "noise_std", "z", "epsilon")


def register(attack_class: type, name: str | None = None, *, overwrite: bool = False) -> str:
    """Make ``faults.clients.K = name`` run ``attack_class`` (a subclass of ``fedhet.attacks.base.Attack``);
    ``name`` defaults to the class's ``name`` attribute. Registration lives in this process (register at
    import time of your script, or advertise the class in the ``fedhet.attacks`` entry-point group so that
    worker processes and Flower nodes find it too). Returns the name."""
    from fedhet.attacks.base import Attack

    if not (inspect.isclass(attack_class) and issubclass(attack_class, Attack)):
        raise ConfigError(
            f"attacks.register: {attack_class!r} is not an Attack subclass; subclass "
            "fedhet.attacks.base.Attack (docs/writing-an-attack.md)"
        )
    if attack_class.kind not in KINDS:
        raise ConfigError(
            f"{attack_class.__name__}.kind = {attack_class.kind!r}; choose one of {list(KINDS)}"
        )
    flat = [k for k in attack_class.flat_parameters if k not in FLAT_KEYS]
    if flat or not isinstance(attack_class.parameters, Mapping):
        raise ConfigError(
            f"{attack_class.__name__}: parameters must be a dict of defaults (read from "
            f"faults.params.<name>) and flat_parameters among {list(FLAT_KEYS)}; got "
            f"{attack_class.parameters!r}, {flat}"
        )
    name = name or getattr(attack_class, "name", None)
    if not isinstance(name, str) or not name.strip() or "." in name or name == "attack":
        raise ConfigError(
            f"attacks.register({attack_class.__name__}): give an attack name without dots (name=... or a "
            f"class attribute name = '...'), not {name!r}"
        )
    if name in BUILT_IN:
        raise ConfigError(
            f"{name!r} is a built-in attack; give {attack_class.__name__} its own name (a class attribute "
            "name = '...', or register(cls, name='...'))"
        )
    if name in _REGISTERED and _REGISTERED[name] is not attack_class and not overwrite:
        raise ConfigError(
            f"an attack named {name!r} is already registered; pass overwrite=True to replace it"
        )
    _REGISTERED[name] = attack_class
    return name


def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {p.name: p for p in entry_points(group="fedhet.attacks")}


def attack_names() -> list[str]:
    """The built-in attacks (in their documented order), then registered ones and installed packages'."""
    extra = sorted((set(_REGISTERED) | set(_entry_points())) - set(BUILT_IN))
    return [*BUILT_IN, *extra]


def is_attack(name: Any) -> bool:
    """Whether ``name`` names an attack (built-in, registered, or an installed package's); imports none."""
    if not isinstance(name, str):
        return False
    return name in BUILT_IN or name in _REGISTERED or name in _entry_points()


def unknown_attack(what: str) -> ConfigError:
    """The error for ``what`` (a setting naming no attack): the accepted ones, and how to add one."""
    return ConfigError(
        f"{what} is not a fault; choose one of {attack_names()}, or register your own with "
        "fedhet.attacks.register (or the 'fedhet.attacks' entry-point group; docs/writing-an-attack.md)"
    )


def attack_class(name: str) -> type:
    """The attack class registered under ``name``."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in BUILT_IN:
        point = _entry_points().get(name)
        if point is None:
            raise unknown_attack(f"attack {name!r}")
        register(point.load(), name)
        return _REGISTERED[name]
    module, _, cls = BUILT_IN[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def build_attack(name: str, faults: Any) -> Any:
    """The attack ``name`` with its parameters: the flat [faults] keys it reads (``flat_parameters``), then
    its own block ``faults.params.<name>`` over its declared defaults. A parameter it does not declare, or
    one of its flat keys given in its block, is a ConfigError naming what it accepts."""
    cls = attack_class(name)
    given = dict(getattr(faults, "params", {}).get(name, {}) or {})
    both = sorted(set(given) & set(cls.flat_parameters))
    if both:
        raise ConfigError(
            f"faults.params.{name} sets {both}, which {name!r} reads from [faults] itself: set "
            + ", ".join(f"faults.{k}" for k in both)
            + " instead"
        )
    unknown = sorted(set(given) - set(cls.parameters))
    if unknown:
        raise ConfigError(
            f"faults.params.{name} has no parameter(s) {unknown}; {name!r} accepts "
            f"{sorted(cls.parameters) or 'none'}"
            + (f" (and reads faults.{', faults.'.join(cls.flat_parameters)})" if cls.flat_parameters else "")
        )
    params = {**cls.parameters, **given, **{k: getattr(faults, k) for k in cls.flat_parameters}}
    attack = cls(**params)
    attack.name = name
    return attack


def check_attacks(faults: Any) -> None:
    """Build every attack the run names (in ``faults.clients`` or ``faults.params``), once, before any data or
    training: an unknown name, parameter or value is a ConfigError now rather than a failed client later
    (the run's start calls this)."""
    for key in sorted(getattr(faults, "params", {}) or {}):
        if not is_attack(key):
            raise unknown_attack(f"faults.params.{key}: {key!r}")
    for name in sorted(set(faults.clients.values()) | set(getattr(faults, "params", {}) or {})):
        build_attack(name, faults)  # a block of an attack no client runs is checked too: likely a mistake
