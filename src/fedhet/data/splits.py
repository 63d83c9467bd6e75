"""Every data split of CELM, FedRAC and ProxyFL, registered by name.

Spec: baselines.md §4, methods.md §1.2 (Splits), §2.2 (Client split), §3.2 (Data).

A split is a pure function ``fn(labels, num_clients, rng, num_classes, **params) -> Partition`` of the pool's
labels; all randomness comes from the ``numpy.random.Generator`` it is given. Indices in a :class:`Partition`
index the ``labels`` array passed in (the caller maps them back to dataset indices).

Names used in the spec: "Dir-client" = ``dirichlet-per-client``, "Dir-class" = ``dirichlet-per-class``,
"Dir-flgo" = ``dirichlet-prior``, "Dir-pair" = ``dirichlet-pairs`` (they are not interchangeable, §4.1).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedhet.errors import ConfigError, DataError

#: Upper bound on the redraw loops of the retrying splits (Dir-class, Dir-pair); reaching it means the
#: parameters (tiny alpha, large minimum size) are practically unsatisfiable: we say so instead of hanging.
MAX_ATTEMPTS = 2_000

#: The scipy ``powerlaw`` shape of CGSV/CFFL/FedRAC's POW split (baselines.md §4.3).
POWERLAW_SHAPE = 1.65911332899


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
) -> Callable[[Callable[..., Partition]], Callable[..., Partition]]:
    def deco(fn: Callable[..., Partition]) -> Callable[..., Partition]:
        SPLITS[name] = SplitSpec(name=name, fn=fn, params=params, doc=doc, bases=bases, check=check)
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
) -> Partition:
    """Split the pool ``labels`` over ``num_clients`` clients with the registered split ``name``.

    ``seed``: an int (-> ``np.random.default_rng(seed)``) or a Generator used as is. ``info`` gets the split
    name and the resolved parameters.
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
    part = spec.fn(arr, num_clients, rng, k, **resolved)
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


def _class_indices(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """Indices of each class, in ascending index order."""
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=num_classes)
    return np.split(order, np.cumsum(counts)[:-1])


def _shuffled_class_indices(
    labels: np.ndarray, num_classes: int, rng: np.random.Generator
) -> list[np.ndarray]:
    return [rng.permutation(idx) for idx in _class_indices(labels, num_classes)]


def _cut(indices: np.ndarray, proportions: np.ndarray) -> list[np.ndarray]:
    """Cut ``indices`` at the cumulative ``proportions`` (the FedFisher/NIID-Bench ``cumsum`` cut points)."""
    points = (np.cumsum(proportions) * len(indices)).astype(int)[:-1]
    return np.split(indices, points)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def _labels_per_client(min_labels: int, num_clients: int, num_classes: int) -> list[int]:
    """m_i = m_min + i·⌊(K − m_min)/(N − 1)⌋ (SLS/PLS v2, baselines.md §4.4); N = 1 gives m_min."""
    if min_labels > num_classes:
        raise ConfigError(
            f"min_labels={min_labels} exceeds the {num_classes} classes; use min_labels <= {num_classes}"
        )
    step = (num_classes - min_labels) // (num_clients - 1) if num_clients > 1 else 0
    return [min_labels + i * step for i in range(num_clients)]


def _log_dirichlet(rng: np.random.Generator, concentration: np.ndarray, size: int) -> np.ndarray:
    """log of ``size`` draws of Dir(concentration), shape (size, K), exact and free of underflow.

    Uses Gamma(a) = Gamma(a + 1)·U^(1/a) in log space, so tiny concentrations (α = 0.01, where numpy's
    ``dirichlet`` returns exact zeros or NaN) keep their order; ``exp`` of a row is a Dir(concentration) draw.
    """
    concentration = np.asarray(concentration, dtype=np.float64)
    shape = (size, len(concentration))
    log_gamma = np.log(rng.standard_gamma(concentration + 1.0, size=shape))
    log_gamma += np.log1p(-rng.random(shape)) / concentration  # 1 - U lies in (0, 1]: no log(0)
    return log_gamma - _logsumexp(log_gamma, axis=1)


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return top + np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True))


def _softmax(log_weights: np.ndarray) -> np.ndarray:
    """Normalised weights from log weights (-inf = weight 0), without underflowing to an all-zero vector."""
    w = np.exp(log_weights - np.max(log_weights))
    return w / w.sum()


def _dirichlet_client_shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, alpha: float
) -> list[np.ndarray]:
    """Dir-client shards (FedFisher, baselines.md §4.1): q_i ~ Dir(α·1_K); class k cut ∝ q_{i,k}/Σ_j q_{j,k}.

    Class indices are shuffled before the cut and each shard afterwards, as in the reference. The column
    normalisation is done in log space, so at α = 0.01 a class still goes to the client(s) that weigh it
    most instead of hitting 0/0.
    """
    log_mix = _log_dirichlet(rng, np.full(num_classes, alpha), num_clients)  # (N, K)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k, idx in enumerate(_shuffled_class_indices(labels, num_classes, rng)):
        for i, piece in enumerate(_cut(idx, _softmax(log_mix[:, k]))):
            parts[i].append(piece)
    return [rng.permutation(_concat(p)) for p in parts]


def _balanced_dirichlet_cuts(
    class_idx: list[np.ndarray],
    num_workers: int,
    alpha: float,
    rng: np.random.Generator,
    capacity: float,
) -> tuple[list[list[np.ndarray]], np.ndarray]:
    """One NIID-Bench pass: per class p ~ Dir(α·1_n) over workers; p_j := 0 where worker j has >= capacity.

    Some worker is always below capacity while samples remain, so the renormalised share is well defined.
    """
    parts: list[list[np.ndarray]] = [[] for _ in range(num_workers)]
    sizes = np.zeros(num_workers, dtype=np.int64)
    for idx in class_idx:
        if len(idx) == 0:
            continue
        log_share = _log_dirichlet(rng, np.full(num_workers, alpha), 1)[0]
        log_share[sizes >= capacity] = -np.inf
        for w, piece in enumerate(_cut(idx, _softmax(log_share))):
            parts[w].append(piece)
            sizes[w] += len(piece)
    return parts, sizes


def _balanced_dirichlet_retry(
    class_idx: list[np.ndarray],
    num_workers: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int,
    failure: str,
) -> tuple[list[list[np.ndarray]], int]:
    """Redo :func:`_balanced_dirichlet_cuts` (capacity = average size) until every worker has >= ``min_size``.

    Returns (parts, attempts); ConfigError(``failure``) after MAX_ATTEMPTS draws.
    """
    capacity = sum(len(idx) for idx in class_idx) / num_workers
    for attempt in range(1, MAX_ATTEMPTS + 1):
        parts, sizes = _balanced_dirichlet_cuts(class_idx, num_workers, alpha, rng, capacity)
        if sizes.min() >= min_size:
            return parts, attempt
    raise ConfigError(failure)


# ----------------------------------------------------------------------------------------------------------
# Splits
# ----------------------------------------------------------------------------------------------------------

_ALPHA_DOC = "Dirichlet concentration; smaller is more skewed."


@_register("iid", doc="Equal random shards (UNI; sizes differ by at most 1).")
def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int) -> Partition:
    """UNI (baselines.md §4.6): a random permutation cut into N near-equal shards (``np.array_split``)."""
    return Partition(clients=np.array_split(rng.permutation(len(labels)), num_clients))


@_register(
    "dirichlet-per-client",
    (SplitParam("alpha", float, 0.1, _ALPHA_DOC + " CELM uses 0.01, 0.05, 0.10.", 0.0, True),),
    doc="Dir-client (CELM / FedFisher): per-client class mixture q_i ~ Dir(alpha·1); unequal sizes.",
)
def dirichlet_per_client(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, alpha: float
) -> Partition:
    """Dir-client (baselines.md §4.1): q_i ~ Dir(α·1_K); each class cut over clients ∝ q_{i,k}/Σ_j q_{j,k}."""
    return Partition(clients=_dirichlet_client_shards(labels, num_clients, rng, num_classes, alpha))


@_register(
    "dirichlet-per-class",
    (
        SplitParam("alpha", float, 0.5, _ALPHA_DOC + " (beta in NIID-Bench).", 0.0, True),
        SplitParam("min_size", int, 10, "Redraw until every client has at least this many samples.", 0),
    ),
    doc="Dir-class (NIID-Bench labeldir): per class Dir(alpha·1), full clients get none; retry to min_size.",
)
def dirichlet_per_class(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    alpha: float,
    min_size: int,
) -> Partition:
    """Dir-class (baselines.md §4.1(a), IAFL/NIID-Bench ``noniid-labeldir``).

    Per class k: p ~ Dir(β·1_N), p_j := 0 for clients with >= total/N samples, cut ∝ p; redraw all until
    min size >= ``min_size``. Class indices are shuffled once (redraws only change the proportions, which is
    equivalent in distribution to the reference's reshuffle per redraw).
    """
    total = len(labels)
    if min_size * num_clients > total:
        raise ConfigError(
            f"split 'dirichlet-per-class': min_size={min_size} × {num_clients} clients exceeds the {total} "
            "samples; "
            f"use min_size <= {total // num_clients}"
        )
    class_idx = _shuffled_class_indices(labels, num_classes, rng)
    parts, attempt = _balanced_dirichlet_retry(
        class_idx,
        num_clients,
        alpha,
        rng,
        min_size,
        f"split 'dirichlet-per-class': no draw in {MAX_ATTEMPTS} gave every client >= min_size={min_size} "
        f"samples with alpha={alpha}; lower min_size or raise alpha",
    )
    clients = [rng.permutation(_concat(p)) for p in parts]
    return Partition(clients=clients, info={"attempts": attempt})


@_register(
    "dirichlet-prior",
    (
        SplitParam(
            "alpha",
            float,
            3.0,
            "flgo Dir(alpha·p) with p the label prior: 3.0 gives 0.3 per class on balanced 10-class data.",
            0.0,
            True,
        ),
        SplitParam(
            "tolerance", float, 1e-6, "Initial bound on ||mixture − p||² (×10 every 500 tries).", 0.0, True
        ),
    ),
    doc="Dir-flgo (FedRAC DIR(a)): equal sizes, q_i ~ Dir(a·p), mixtures resampled until they average to p.",
)
def dirichlet_prior(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    alpha: float,
    tolerance: float,
) -> Partition:
    """flgo ``DirichletPartitioner`` (baselines.md §4.3 DIR(a)), imbalance 0.

    Target sizes s_i = ⌊T/N⌋ (+1 for the first T mod N). q_i ~ Dir(a·p) over the present classes. Loop:
    stop when ||Σ_i s_i q_i / T − p||² <= tol; else take the next client (cycling in order of increasing s_i),
    draw N candidate mixtures and swap in the best one if it lowers the error; tol ×= 10 every 500 tries.
    Then class k's shuffled indices are cut ∝ q_{i,k}·s_i. Client sizes are equal up to the mixture error.
    """
    total = len(labels)
    counts = np.bincount(labels, minlength=num_classes)
    present = np.flatnonzero(counts)
    prior = counts[present] / total
    concentration = alpha * prior
    target = np.full(num_clients, total // num_clients, dtype=np.int64)
    target[: total % num_clients] += 1

    # Mixtures are kept as logs (see _log_dirichlet): flgo's NaN redraw guard is then never needed, and the
    # per-class cut below cannot hit 0/0 when every client's weight on a rare class is tiny.
    log_mix = _log_dirichlet(rng, concentration, num_clients)
    mixtures = np.exp(log_mix)
    weights = target.astype(np.float64)
    cycle = np.argsort(target, kind="stable")
    interval = 500
    max_error = tolerance
    loop_count = 0
    iterations = 0
    position = 0
    while True:
        if loop_count >= interval:
            loop_count = 0
            max_error *= 10
        mass = weights @ mixtures
        error = float((((mass / mass.sum()) - prior) ** 2).sum())
        if error <= max_error:
            break
        exc = cycle[position]
        position = (position + 1) % num_clients
        log_candidates = _log_dirichlet(rng, concentration, num_clients)
        candidates = np.exp(log_candidates)
        rest = mass - weights[exc] * mixtures[exc]
        alt = rest[None, :] + weights[exc] * candidates
        alt_err = (((alt / alt.sum(axis=1, keepdims=True)) - prior) ** 2).sum(axis=1)
        best = int(np.argmin(alt_err))
        if alt_err[best] < error:
            mixtures[exc] = candidates[best]
            log_mix[exc] = log_candidates[best]
        loop_count += 1
        iterations += 1
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    class_idx = _shuffled_class_indices(labels, num_classes, rng)
    log_weights = np.log(np.maximum(weights, 1e-300))
    for j, k in enumerate(present):
        for i, piece in enumerate(_cut(class_idx[k], _softmax(log_mix[:, j] + log_weights))):
            parts[i].append(piece)
    full_mix = np.zeros((num_clients, num_classes))
    full_mix[:, present] = mixtures
    info: dict[str, Any] = {
        "target_sizes": target.tolist(),
        "mixtures": full_mix.tolist(),
        "prior": (counts / total).tolist(),
        "mixture_error": error,
        "tolerance_used": max_error,
        "iterations": iterations,
    }
    return Partition(clients=[rng.permutation(_concat(p)) for p in parts], info=info)


@_register(
    "dirichlet-pairs",
    (SplitParam("alpha", float, 0.1, _ALPHA_DOC + " 0 means IID (SAGE clients_indices_homo).", 0.0),),
    doc="Dir-pair (SAGE/ProxyFL): Dir(alpha·1_2) in ⌈N/2⌉ random chunks of 2 workers, then N equal parts.",
)
def dirichlet_pairs(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, alpha: float
) -> Partition:
    """SAGE ``clients_indices`` (baselines.md §4.2).

    Shuffle; cut into ⌈N/2⌉ chunks of int(2/N·T) (the last takes the rest, with N − 2(⌈N/2⌉−1) workers);
    per chunk, per class Dir(α·1_2) with NIID-Bench balancing, redrawn until the smallest worker has >=
    int(0.5·chunk/2); concatenate the workers (class-ordered) and re-cut into N equal contiguous parts (the
    first T mod N get one more). α = 0: per-class equal slices ⌊c/N·n_k⌋ (``clients_indices_homo``).
    Deviation: a chunk whose threshold rounds to 0 is still split once (the reference drops it).
    """
    total = len(labels)
    if alpha == 0:
        clients: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in _shuffled_class_indices(labels, num_classes, rng):
            bounds = [math.floor(c / num_clients * len(idx)) for c in range(num_clients + 1)]
            for c in range(num_clients):
                clients[c].append(idx[bounds[c] : bounds[c + 1]])
        return Partition(clients=[_concat(c) for c in clients], info={"iid": True})
    if num_clients < 2:
        raise ConfigError(
            f"split 'dirichlet-pairs' with alpha={alpha} needs at least 2 clients (it pairs workers); "
            f"got {num_clients}. Use alpha=0 (IID) or more clients"
        )
    order = rng.permutation(total)
    num_chunks = math.ceil(num_clients / 2)
    chunk_len = int(2 / num_clients * total)
    workers_per_chunk = [2] * (num_chunks - 1) + [num_clients - 2 * (num_chunks - 1)]
    sequence: list[np.ndarray] = []
    attempts: list[int] = []
    for c, n_workers in enumerate(workers_per_chunk):
        chunk = order[c * chunk_len : (total if c == num_chunks - 1 else (c + 1) * chunk_len)]
        chunk_labels = labels[chunk]
        # Per class, in chunk (i.e. shuffled) order, as the reference's np.where over the chunk.
        class_idx = [chunk[np.flatnonzero(chunk_labels == k)] for k in range(num_classes)]
        need = int(0.50 * len(chunk) / n_workers)
        parts, attempt = _balanced_dirichlet_retry(
            class_idx,
            n_workers,
            alpha,
            rng,
            need,
            f"split 'dirichlet-pairs': chunk {c} found no draw in {MAX_ATTEMPTS} with every worker >= {need} "
            f"samples at alpha={alpha}; raise alpha",
        )
        attempts.append(attempt)
        sequence.extend(_concat(p) for p in parts)
    flat = _concat(sequence)
    per, extra = divmod(len(flat), num_clients)
    sizes_out = [per + 1 if i < extra else per for i in range(num_clients)]
    bounds = np.concatenate([[0], np.cumsum(sizes_out)])
    clients_out = [flat[bounds[i] : bounds[i + 1]] for i in range(num_clients)]
    return Partition(clients=clients_out, info={"attempts": attempts})


def _pow_sizes(num_clients: int, total: int) -> list[int]:
    """POW shard sizes: ⌈b_i/Σb·T⌉, b = linspace(F⁻¹(0.01), F⁻¹(0.99), N), F = scipy powerlaw(a = 1.659...).

    F(x) = x^a on [0, 1], so F⁻¹(q) = q^(1/a) (computed directly; equal to scipy's ``powerlaw.ppf``). The
    ceilings overshoot T by up to N−1; the excess is removed one sample at a time from the currently largest
    shard (the first of ties), which keeps sizes non-decreasing. For N <= 85 this is exactly the reference,
    whose final slice simply comes up short on the last shard.
    """
    b = np.linspace(0.01 ** (1 / POWERLAW_SHAPE), 0.99 ** (1 / POWERLAW_SHAPE), num_clients)
    sizes = np.array([math.ceil(x) for x in b / b.sum() * total], dtype=np.int64)
    for _ in range(int(sizes.sum()) - total):
        sizes[int(np.argmax(sizes))] -= 1
    return sizes.tolist()


@_register(
    "pow",
    (
        SplitParam(
            "samples_per_client",
            int,
            2000,
            "Mean shard size; uses the first samples_per_client·N samples of a random permutation.",
            1,
        ),
    ),
    doc="POW (CGSV/CFFL/FedRAC): powerlaw quantile ramp of shard sizes over samples_per_client·N samples.",
)
def pow_split(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, samples_per_client: int
) -> Partition:
    """POW (baselines.md §4.3): contiguous blocks of a random permutation, sizes from the powerlaw ramp."""
    total = samples_per_client * num_clients
    if total > len(labels):
        raise ConfigError(
            f"split 'pow': samples_per_client={samples_per_client} × {num_clients} clients = {total} "
            "exceeds the "
            f"{len(labels)} samples; use samples_per_client <= {len(labels) // num_clients}"
        )
    chosen = rng.permutation(len(labels))[:total]
    sizes = _pow_sizes(num_clients, total)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return Partition(
        clients=[chosen[bounds[i] : bounds[i + 1]] for i in range(num_clients)], info={"sizes": sizes}
    )


@_register(
    "cla",
    (SplitParam("samples_per_client", int, 2000, "Samples per client (all clients equal).", 1),),
    doc="CLA (CGSV/CFFL/FedRAC): client i has classes 0..k_i-1, k_i = int(linspace(1, K, N))_i, drawn with "
    "replacement.",
)
def cla(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, samples_per_client: int
) -> Partition:
    """CLA / ``classimbalance`` (baselines.md §4.3).

    Per class c < k_i: ⌊S/k_i⌋ draws with replacement from the class's remaining pool; then top up to S from
    class k_i − 1 without replacement (those samples leave the pool for later clients, as in the reference).
    """
    class_sizes = np.linspace(1, num_classes, num_clients).astype(int)
    pools = _shuffled_class_indices(labels, num_classes, rng)
    offsets = [0] * num_classes
    clients = []
    for i, k_i in enumerate(class_sizes):
        per_class = samples_per_client // int(k_i)
        parts = []
        for c in range(int(k_i)):
            pool = pools[c][offsets[c] :]
            if len(pool) == 0:
                raise DataError(
                    f"split 'cla': class {c} has no samples left for client {i}; it needs class {c}"
                )
            parts.append(pool[rng.integers(0, len(pool), size=per_class)])
        extra = samples_per_client - per_class * int(k_i)
        last = int(k_i) - 1
        pool = pools[last][offsets[last] :]
        if extra > len(pool):
            raise DataError(
                f"split 'cla': class {last} has {len(pool)} samples left, client {i} needs {extra}"
            )
        parts.append(pool[:extra])
        offsets[last] += extra
        clients.append(_concat(parts))
    return Partition(clients=clients, info={"classes_per_client": class_sizes.tolist()})


def _label_skew_check(params: dict[str, Any]) -> None:
    if params["max_samples_per_label"] < params["min_samples_per_label"]:
        raise ConfigError(
            f"split 'pure-label-skew': max_samples_per_label={params['max_samples_per_label']} is below "
            f"min_samples_per_label={params['min_samples_per_label']}; it must be >= it"
        )


_MIN_LABELS = SplitParam(
    "min_labels", int, 2, "m_min: labels of client 0 (spec default 2 for CIFAR-10/F-MNIST).", 1
)


@_register(
    "pure-label-skew",
    (
        _MIN_LABELS,
        SplitParam("min_samples_per_label", int, 100, "min_spl (spec default 100).", 1),
        SplitParam(
            "max_samples_per_label",
            int,
            3000,
            "max_spl: 3000 for F/MNIST (default), 2000 for CIFAR-10, "
            "400 for CIFAR-100; set it per dataset in the config.",
            1,
        ),
    ),
    doc="PLS (CELM, spectralfuse only_label_skew v2): per-client label sets, then all clients subsampled "
    "to the smallest size.",
    check=_label_skew_check,
)
def pure_label_skew(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    min_labels: int,
    min_samples_per_label: int,
    max_samples_per_label: int,
) -> Partition:
    """PLS v2 (baselines.md §4.4). Client i in order picks m_i random labels and, per label, takes
    min(n_i, left) unused samples, n_i = min_spl + (N − i)·⌊(max_spl − min_spl)/N⌋, skipping labels with
    < min_spl left, stopping once its total exceeds m_min·max_spl; finally all are subsampled to the smallest.
    """
    targets = _labels_per_client(min_labels, num_clients, num_classes)
    step = (max_samples_per_label - min_samples_per_label) // num_clients
    per_label = [min_samples_per_label + (num_clients - i) * step for i in range(num_clients)]
    pools = _shuffled_class_indices(labels, num_classes, rng)
    used = [0] * num_classes
    cap = min_labels * max_samples_per_label
    raw: list[np.ndarray] = []
    chosen_labels: list[list[int]] = []
    for i in range(num_clients):
        chosen = rng.choice(num_classes, size=targets[i], replace=False)
        chosen_labels.append([int(c) for c in chosen])
        parts: list[np.ndarray] = []
        count = 0
        for c in chosen:
            left = len(pools[c]) - used[c]
            if left < min_samples_per_label:
                continue
            take = min(per_label[i], left)
            parts.append(pools[c][used[c] : used[c] + take])
            used[c] += take
            count += take
            if count > cap:
                break
        raw.append(rng.permutation(_concat(parts)))
    smallest = min(len(r) for r in raw)
    if smallest == 0:
        empty = [i for i, r in enumerate(raw) if len(r) == 0]
        raise ConfigError(
            f"split 'pure-label-skew': clients {empty} got no samples (their labels were used up); lower "
            f"max_samples_per_label={max_samples_per_label} or min_samples_per_label={min_samples_per_label}"
        )
    clients = [rng.choice(r, size=smallest, replace=False) for r in raw]
    info = {
        "target_labels": targets,
        "target_samples_per_label": per_label,
        "chosen_labels": chosen_labels,
        "raw_sizes": [int(len(r)) for r in raw],
        "final_size": int(smallest),
    }
    return Partition(clients=clients, info=info)


@_register(
    "step-label-skew",
    (_MIN_LABELS,),
    doc="SLS (CELM, spectralfuse step_label_skew v2): client i has m_min + i·⌊(K−m_min)/(N−1)⌋ labels; "
    "each label split equally among its holders.",
)
def step_label_skew(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, min_labels: int
) -> Partition:
    """SLS v2 (baselines.md §4.4): random label sets of growing size; each label's full index set is split
    equally (``array_split``, in client order) among the clients holding it; unchosen labels are unused."""
    targets = _labels_per_client(min_labels, num_clients, num_classes)
    chosen = [set(int(c) for c in rng.choice(num_classes, size=m, replace=False)) for m in targets]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k, idx in enumerate(_shuffled_class_indices(labels, num_classes, rng)):
        holders = [i for i in range(num_clients) if k in chosen[i]]
        if not holders:
            continue
        for i, piece in zip(holders, np.array_split(idx, len(holders)), strict=True):
            parts[i].append(piece)
    clients = [rng.permutation(_concat(p)) for p in parts]
    info = {"target_labels": targets, "chosen_labels": [sorted(c) for c in chosen]}
    return Partition(clients=clients, info=info)


@_register(
    "step-quantity",
    (
        SplitParam(
            "gamma", float, 0.05, "gamma: share step between consecutive clients; |gamma| < 2/(N(N−1)).", None
        ),
    ),
    doc="Step quantity (spectralfuse): all labels, client i gets share 1/N − (N−1)γ/2 + iγ of each label.",
)
def step_quantity(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, num_classes: int, gamma: float
) -> Partition:
    """``step_quantity`` (baselines.md §4.4): per label, client i draws ⌊(1/N − (N−1)γ/2 + iγ)·n_k⌋ samples
    without replacement; the reference's assertion |γ| < 2/(N(N−1)) is a ConfigError here."""
    if num_clients > 1 and not abs(gamma) < 2 / (num_clients * (num_clients - 1)):
        limit = 2 / (num_clients * (num_clients - 1))
        raise ConfigError(
            f"split 'step-quantity': gamma={gamma} needs |gamma| < 2/(N(N-1)) = {limit:.6g} "
            f"for N={num_clients} "
            f"(else client 0's share 1/N - (N-1)gamma/2 is not positive); use e.g. gamma={limit / 2:.4g}"
        )
    ratios = 1 / num_clients - (num_clients - 1) / 2 * gamma + gamma * np.arange(num_clients)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for idx in _shuffled_class_indices(labels, num_classes, rng):
        lens = np.floor(ratios * len(idx)).astype(np.int64)
        bounds = np.concatenate([[0], np.cumsum(lens)])
        for i in range(num_clients):
            parts[i].append(idx[bounds[i] : bounds[i + 1]])
    return Partition(clients=[rng.permutation(_concat(p)) for p in parts], info={"shares": ratios.tolist()})


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
    "labeled-unlabeled",
    (
        SplitParam(
            "labeled_per_class",
            int,
            500,
            "Labeled samples per class (CIFAR-10 500, CIFAR-100 50, SVHN 460, CINIC-10 900).",
            1,
        ),
        SplitParam(
            "alpha", float, 0.1, "Dir-pair concentration of the base split (0 = IID); unused by 'iid'.", 0.0
        ),
        SplitParam(
            "base",
            str,
            "dirichlet-pairs",
            "Split applied separately to the labeled and unlabeled pools.",
            choices=("dirichlet-pairs", "iid"),
        ),
        SplitParam(
            "labeled_clients",
            list,
            None,
            "Only these clients hold labels (default: every client). The same labeled pool is split over "
            "them alone; the others hold unlabeled data only.",
            0,
        ),
    ),
    doc="FSSL (SAGE/ProxyFL): labeled_per_class labels per class; labeled and unlabeled pools split "
    "separately; "
    "each client's labeled samples appended to its unlabeled set.",
)
def labeled_unlabeled(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    num_classes: int,
    labeled_per_class: int,
    alpha: float,
    base: str,
    labeled_clients: list[int] | None = None,
) -> Partition:
    """SAGE/ProxyFL protocol (methods.md §2.2, baselines.md §3.1). ``clients`` = labeled indices;
    ``unlabeled[i]`` = client i's unlabeled indices followed by (at the end) a copy of its labeled ones.

    With ``labeled_clients`` [ours, beyond ProxyFL's "every client holds labels"], the labeled pool is split
    over the listed clients only, so the label budget stays labeled_per_class·K wherever the labels sit; the
    other clients' labeled sets are empty.
    """
    holders = list(range(num_clients)) if labeled_clients is None else sorted(labeled_clients)
    outside = [c for c in holders if c >= num_clients]
    if outside:
        raise ConfigError(
            f"split 'labeled-unlabeled': labeled_clients {outside} are not clients of a {num_clients}-client "
            f"federation; use ids 0..{num_clients - 1}"
        )
    labeled_parts = []
    for k, idx in enumerate(_class_indices(labels, num_classes)):
        if len(idx) == 0:
            continue
        if len(idx) < labeled_per_class:
            raise ConfigError(
                f"split 'labeled-unlabeled': class {k} has {len(idx)} samples, fewer than labeled_per_class="
                f"{labeled_per_class}; use labeled_per_class <= {len(idx)}"
            )
        labeled_parts.append(rng.permutation(idx)[:labeled_per_class])
    labeled = np.sort(_concat(labeled_parts))
    unlabeled = np.setdiff1d(np.arange(len(labels)), labeled)
    for pool, what, count in ((labeled, "labeled", len(holders)), (unlabeled, "unlabeled", num_clients)):
        if len(pool) < count:
            raise ConfigError(
                f"split 'labeled-unlabeled': the {what} pool has {len(pool)} samples for {count} "
                "clients; "
                "change labeled_per_class or use fewer clients"
            )

    def split(pool: np.ndarray, count: int) -> Partition:
        if count == 1:  # one holder takes the whole pool; Dir-pairs needs two workers to pair
            return Partition(clients=[np.arange(len(pool))])
        if base == "iid":
            return iid(labels[pool], count, rng, num_classes)
        return dirichlet_pairs(labels[pool], count, rng, num_classes, alpha)

    lab_part = split(labeled, len(holders))
    unl_part = split(unlabeled, num_clients)
    clients = [labeled[:0] for _ in range(num_clients)]
    for holder, part in zip(holders, lab_part.clients, strict=True):
        clients[holder] = labeled[part]
    unl = [_concat([unlabeled[u], clients[i]]) for i, u in enumerate(unl_part.clients)]
    info = {
        "labeled_per_class": labeled_per_class,
        "num_labeled": int(len(labeled)),
        "num_unlabeled": int(len(unlabeled)),
        "base": base,
        "labeled_info": _jsonable(lab_part.info),
        "unlabeled_info": _jsonable(unl_part.info),
    }
    if labeled_clients is not None:
        info["labeled_clients"] = holders
    return Partition(clients=clients, unlabeled=unl, info=info)
