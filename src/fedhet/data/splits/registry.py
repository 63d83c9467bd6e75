"""The split registry: :class:`Partition`, parameter specs and their validation, and the entry points
:func:`make_partition` and :func:`holdout_validation`.

Splits register here with ``@_register``; the family modules of this package hold them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedhet.errors import ConfigError, DataError

# ----------------------------------------------------------------------------------------------------------
# Data types
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Partition:
    """Per-client index arrays into the split's ``labels`` (+ unlabeled pools for the semi-supervised split).

    ``info`` holds JSON-friendly facts about the draw, e.g. ``{"rare_classes": [0], "maverick_clients": [0]}``
    or ``{"free_rider": 0}``.
    """

    clients: list[np.ndarray]
    unlabeled: list[np.ndarray] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.clients = [np.asarray(c, dtype=np.int64).reshape(-1) for c in self.clients]
        if self.unlabeled is not None:
            self.unlabeled = [np.asarray(u, dtype=np.int64).reshape(-1) for u in self.unlabeled]
            if len(self.unlabeled) != len(self.clients):
                raise ValueError(
                    f"Partition has {len(self.clients)} labeled and {len(self.unlabeled)} unlabeled client "
                    "lists; they must be equally long (one per client)"
                )

    @property
    def num_clients(self) -> int:
        """Number of clients N."""
        return len(self.clients)

    def sizes(self) -> list[int]:
        """Number of (labeled) indices per client, repeats included."""
        return [int(len(c)) for c in self.clients]

    def class_counts(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """(N, K) int64 matrix: how many of client i's (labeled) indices carry class k (repeats counted)."""
        labels = np.asarray(labels)
        counts = np.zeros((len(self.clients), num_classes), dtype=np.int64)
        for i, idx in enumerate(self.clients):
            if len(idx):
                row = np.bincount(labels[idx], minlength=num_classes)
                if len(row) > num_classes:
                    raise ValueError(
                        f"client {i} holds class {len(row) - 1} but num_classes={num_classes}; pass the "
                        "dataset's class count"
                    )
                counts[i] = row
        return counts


@dataclass(frozen=True)
class SplitParam:
    """One split parameter: name, type (int, float, str or list of ints), default, doc and allowed range."""

    name: str
    type: type
    default: Any
    doc: str
    minimum: float | None = None
    #: True: the value must be strictly greater than ``minimum``.
    exclusive_minimum: bool = False
    maximum: float | None = None
    choices: tuple[str, ...] | None = None

    def accepted(self) -> str:
        """Human-readable description of the accepted values, for error messages."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        kind = {int: "an integer", float: "a number", str: "a string", list: "a list of integers"}[self.type]
        bounds = []
        if self.minimum is not None:
            bounds.append(f"{'>' if self.exclusive_minimum else '>='} {self.minimum:g}")
        if self.maximum is not None:
            bounds.append(f"<= {self.maximum:g}")
        if self.type is list and bounds:
            kind += " each"
        return kind + (" " + " and ".join(bounds) if bounds else "")


@dataclass(frozen=True)
class SplitSpec:
    """A registered split: its function, parameters and a one-line description.

    ``bases`` lists the splits a composite split (maverick) may use as its base; parameters of the base are
    passed prefixed with ``base_`` (e.g. ``base_alpha``). ``check`` validates cross-parameter constraints.
    """

    name: str
    fn: Callable[..., Partition]
    params: tuple[SplitParam, ...]
    doc: str
    bases: tuple[str, ...] = ()
    check: Callable[[dict[str, Any]], None] | None = None
    #: The split reads each row's site (``make_partition(site_of=...)``) instead of drawing a layout.
    needs_sites: bool = False

    def param(self, name: str) -> SplitParam:
        """The parameter called ``name``."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


SPLITS: dict[str, SplitSpec] = {}

#: What a split's meaningful setting needs beyond fedhet's general defaults (10 rounds, constant lr), and the
#: shipped experiment that has it (``fedhet partition --list`` prints it).
SPLIT_ADVICE: dict[str, str] = {
    "maverick": "the rare class is learned late: the papers' setting is 100 rounds with a cosine schedule "
    "(celm/fmnist-maverick); 10 rounds at a constant lr can leave its recall at 0",
    "free-rider": "100 rounds with a cosine schedule (celm/fmnist-free-rider)",
    "pure-label-skew": "100 rounds with a cosine schedule (celm/fmnist-pls)",
    "step-label-skew": "100 rounds with a cosine schedule (celm/fmnist-sls)",
    "dirichlet-per-client": "100 rounds with a cosine schedule at small alpha (celm/fmnist-dir0.05)",
    "cla": "FedRAC's setting: 2000 rounds of 5 local steps, a validation split (fedrac/fashion-mnist-cla)",
    "pow": "FedRAC's setting: 2000 rounds of 1 local step, a validation split (fedrac/fashion-mnist-pow)",
    "dirichlet-prior": "FedRAC's setting: 2000 rounds of 5 local steps (fedrac/fashion-mnist-dir7)",
    "labeled-unlabeled": "a semi-supervised method and resnet8; proxyfl/fashion-mnist-fast runs 40 rounds",
}


def _register(
    name: str,
    params: tuple[SplitParam, ...] = (),
    doc: str = "",
    bases: tuple[str, ...] = (),
    check: Callable[[dict[str, Any]], None] | None = None,
    needs_sites: bool = False,
) -> Callable[[Callable[..., Partition]], Callable[..., Partition]]:
    def deco(fn: Callable[..., Partition]) -> Callable[..., Partition]:
        SPLITS[name] = SplitSpec(
            name=name, fn=fn, params=params, doc=doc, bases=bases, check=check, needs_sites=needs_sites
        )
        return fn

    return deco


# ----------------------------------------------------------------------------------------------------------
# Parameter validation
# ----------------------------------------------------------------------------------------------------------


def _coerce_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("a boolean is not an integer")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if float(value).is_integer():
            return int(value)
        raise ValueError("not a whole number")
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            as_float = float(text)  # "2.0" is fine, "2.5" and "abc" raise
            if not as_float.is_integer():
                raise ValueError("not a whole number") from None
            return int(as_float)
    raise ValueError(f"cannot read an integer from a {type(value).__name__}")


def _coerce_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(value, (int, float, np.integer, np.floating)):
        out = float(value)
    elif isinstance(value, str):
        out = float(value.strip())
    else:
        raise ValueError(f"cannot read a number from a {type(value).__name__}")
    if not math.isfinite(out):
        raise ValueError("not a finite number")
    return out


def _coerce_list(value: Any) -> list[int]:
    if isinstance(value, str):
        text = value.strip().strip("[]()").strip()
        if not text:
            return []
        return [_coerce_int(part) for part in text.split(",") if part.strip()]
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_coerce_int(v) for v in list(value)]
    return [_coerce_int(value)]


def _coerce(split: str, p: SplitParam, value: Any) -> Any:
    try:
        if p.type is int:
            out: Any = _coerce_int(value)
        elif p.type is float:
            out = _coerce_float(value)
        elif p.type is list:
            out = _coerce_list(value)
        elif p.type is str:
            if not isinstance(value, str):
                raise ValueError(f"expected a string, got a {type(value).__name__}")
            out = value.strip()
        else:  # pragma: no cover - registry bug
            raise TypeError(f"unsupported parameter type {p.type}")
    except ValueError as exc:
        raise ConfigError(
            f"split {split!r}: parameter {p.name!r} = {value!r} is invalid ({exc}); accepted: {p.accepted()} "
            f"(default {p.default!r}). {p.doc}"
        ) from None
    items = out if isinstance(out, list) else [out]
    for v in items:
        bad = (
            (p.choices is not None and v not in p.choices)
            or (p.minimum is not None and (v <= p.minimum if p.exclusive_minimum else v < p.minimum))
            or (p.maximum is not None and v > p.maximum)
        )
        if bad:
            raise ConfigError(
                f"split {split!r}: parameter {p.name!r} = {value!r} is out of range; "
                f"accepted: {p.accepted()} (default {p.default!r}). {p.doc}"
            )
    if p.type is list:
        if not out:
            raise ConfigError(
                f"split {split!r}: parameter {p.name!r} is empty; give at least one integer, e.g. 0"
            )
        if len(set(out)) != len(out):
            raise ConfigError(
                f"split {split!r}: parameter {p.name!r} = {value!r} repeats a value; list each once"
            )
    return out


def _get_spec(name: str) -> SplitSpec:
    if not isinstance(name, str) or name not in SPLITS:
        raise ConfigError(f"unknown split {name!r}; accepted splits: {', '.join(sorted(SPLITS))}")
    return SPLITS[name]


def validate_split_params(name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check ``params`` for split ``name``: fill defaults, coerce strings ("0.05", "0,1"), range-check.

    Raises ConfigError naming the parameter, the bad value and the accepted values.
    """
    spec = _get_spec(name)
    given = dict(params or {})
    known = {p.name for p in spec.params}
    out: dict[str, Any] = {}
    for p in spec.params:
        out[p.name] = _coerce(name, p, given[p.name]) if p.name in given else copy.deepcopy(p.default)
    base_given = {k: v for k, v in given.items() if k not in known}
    if spec.bases:
        base = out["base"]
        base_spec = _get_spec(base)
        inner: dict[str, Any] = {}
        for key, value in base_given.items():
            if not key.startswith("base_") or key[5:] not in {p.name for p in base_spec.params}:
                accepted = sorted(known | {"base_" + p.name for p in base_spec.params})
                raise ConfigError(
                    f"split {name!r} (base {base!r}) has no parameter {key!r}; its parameters are: "
                    f"{', '.join(accepted)}"
                )
            inner[key[5:]] = value
        for key, value in validate_split_params(base, inner).items():
            out["base_" + key] = value
    elif base_given:
        key = sorted(base_given)[0]
        accepted = ", ".join(p.name for p in spec.params) or "(none)"
        raise ConfigError(f"split {name!r} has no parameter {key!r}; its parameters are: {accepted}")
    if spec.check is not None:
        spec.check(out)
    return out


# ----------------------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------------------


def _check_labels(labels: np.ndarray, num_classes: int | None) -> tuple[np.ndarray, int]:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise DataError(f"labels must be a 1-D array of class ids, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"labels must be integers (class ids), got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise DataError(f"labels must be >= 0, found {int(arr.min())}")
    seen = int(arr.max()) + 1 if arr.size else 0
    if num_classes is None:
        num_classes = seen
    num_classes = int(num_classes)
    if num_classes < seen:
        raise DataError(
            f"num_classes={num_classes} but the labels contain class {seen - 1}; pass num_classes >= {seen}"
        )
    if num_classes < 1:
        raise DataError("num_classes must be >= 1 (are the labels empty?)")
    return arr, num_classes


def make_partition(
    name: str,
    labels: np.ndarray,
    num_clients: int,
    seed: int | np.random.Generator,
    params: Mapping[str, Any] | None = None,
    num_classes: int | None = None,
    site_of: np.ndarray | None = None,
) -> Partition:
    """Split the pool ``labels`` over ``num_clients`` clients with the registered split ``name``.

    ``seed``: an int (-> ``np.random.default_rng(seed)``) or a Generator used as is. ``info`` gets the split
    name and the resolved parameters. ``site_of`` (each label's site index) is read by splits that follow
    the data's own layout (``sites``) and refused by the others' absence of need.
    """
    spec = _get_spec(name)
    resolved = validate_split_params(name, params)
    arr, k = _check_labels(labels, num_classes)
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ConfigError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    num_clients = int(num_clients)
    if num_clients > len(arr):
        raise ConfigError(
            f"num_clients={num_clients} exceeds the {len(arr)} samples to split; "
            f"use at most {len(arr)} clients or more data"
        )
    if isinstance(seed, np.random.Generator):
        rng = seed
    elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        rng = np.random.default_rng(int(seed))
    else:
        raise ConfigError(f"seed must be an int or a numpy Generator, got {type(seed).__name__}")
    if spec.needs_sites:
        if site_of is None or len(site_of) != len(arr):
            raise ConfigError(
                f"split {name!r} needs data whose rows name their client: a table with data.client_column, "
                "or a folder with one file per client (train/<client>.csv); these data name none"
            )
        resolved["site_of"] = np.asarray(site_of)
    part = spec.fn(arr, num_clients, rng, k, **resolved)
    resolved.pop("site_of", None)
    if len(part.clients) != num_clients:  # pragma: no cover - split bug
        raise RuntimeError(f"split {name!r} returned {len(part.clients)} clients, expected {num_clients}")
    part.info = {"split": name, "params": _jsonable(resolved), **part.info}
    return part


def holdout_validation(
    num_samples: int, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random server validation hold-out (FedRAC's ``split_dataset(train, 0.1)``, baselines.md §4.3).

    Returns (pool_indices, validation_indices), disjoint, both sorted ascending; |validation| =
    round(fraction·num_samples).
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 0:
        raise ConfigError(f"num_samples must be an integer >= 0, got {num_samples!r}")
    if (
        not isinstance(fraction, (int, float, np.floating))
        or isinstance(fraction, bool)
        or not 0 <= fraction < 1
    ):
        raise ConfigError(f"validation fraction must be a number in [0, 1), got {fraction!r}; e.g. 0.1")
    n_val = int(round(float(fraction) * int(num_samples)))
    perm = rng.permutation(int(num_samples))
    return np.sort(perm[n_val:]).astype(np.int64), np.sort(perm[:n_val]).astype(np.int64)


# ----------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value
