"""Typed experiment configuration: TOML in and out, every field validated.

Sections: ``[data]``, ``[model]``, ``[train]``, ``[method]``, ``[eval]``, the optional ``[faults]``
(injected client faults) and ``[guards]`` (server-side update checks), and the top-level ``seed``, ``out``,
``name``. Unknown keys are errors; every bad value raises :class:`~fedhet.errors.ConfigError` naming the
field, the value and what is accepted. Any key can be overridden with ``section.key=value``
(``--set`` on the command line), e.g. ``data.split_params.alpha=0.05``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedhet.errors import ConfigError


@dataclass
class DataConfig:
    """Which data, how it is split over clients, and what the server holds out."""

    #: A built-in name (``fedhet datasets``), "npz" or "folder" (your own files at ``path``), or a name
    #: registered with ``fedhet.data.register_dataset``.
    dataset: str = "fashion-mnist"
    root: str | None = None
    #: Your own data for dataset = "npz" (one .npz file) or "folder" (train/<class>/, test/<class>/).
    path: str | None = None
    split: str = "iid"
    split_params: dict[str, Any] = field(default_factory=dict)
    clients: int = 10
    #: Fraction of the training set held out as the server's validation set (CFFL, FedRAC, FedSAC).
    validation_fraction: float = 0.0
    #: Use only this many training samples (a seeded random subset, before splitting); None = all.
    max_train_samples: int | None = None
    #: Evaluate on only this many test samples (a seeded random subset); None = the full test set.
    max_test_samples: int | None = None


@dataclass
class ModelConfig:
    name: str = "mlp"
    params: dict[str, Any] = field(default_factory=dict)
    #: Start from another run's final global model (its run directory) instead of the seeded initial one.
    init_from: str | None = None


@dataclass
class TrainConfig:
    """Rounds, participation and local training of every client."""

    rounds: int = 10
    #: Clients per round: a fraction in (0, 1] (float) or a count >= 1 (int).
    clients_per_round: float | int = 1.0
    local_epochs: float = 1.0
    #: If set, a fixed number of local SGD steps per round instead of epochs (FedRAC's ``num_steps``).
    local_steps: int | None = None
    batch_size: int = 64
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    #: Learning-rate schedule over rounds: constant, cosine (to ``lr_min``) or exponential (× ``lr_decay``).
    schedule: str = "constant"
    lr_min: float = 1e-6
    lr_decay: float = 0.977
    #: Gradient-norm clipping in local training; None = off.
    grad_clip: float | None = None
    #: Probability that a sampled client sends nothing in a round (robustness experiments).
    client_dropout: float = 0.0
    device: str = "auto"
    #: torch threads for this process; None leaves torch's default.
    threads: int | None = None


@dataclass
class EvalConfig:
    every: int = 1
    batch_size: int = 2048
    #: Evaluate every client's reward model (where the method defines one).
    rewards: bool = True
    #: Fairness against standalone accuracies: "auto" (when rewards exist), true, or false.
    fairness: str | bool = "auto"
    #: BCF rate α (FedSAC/FedRAC).
    bcf_alpha: float = 0.5
    #: Save a checkpoint every k rounds (and always after the last round); 0 = last round only.
    checkpoint_every: int = 10
    #: Also write every metrics.jsonl number as TensorBoard scalars under RUN_DIR/tensorboard/
    #: (the fedhet[tensorboard] extra). Not part of the experiment: it changes no result.
    tensorboard: bool = False


#: What an injected faulty client does (``[faults] clients``; docs/robustness.md).
FAULT_BEHAVIOURS = ("noise", "scale", "sign-flip", "stale", "nan", "lie-num-examples", "crash", "drop")


@dataclass
class FaultsConfig:
    """Injected client faults, for robustness experiments: which clients misbehave and how.

    ``clients`` maps a client id to one of :data:`FAULT_BEHAVIOURS` (``--set faults.clients.3=noise``).
    ``noise``: weights drawn from N(0, ``noise_std``²), a random model; ``scale``: the update × ``factor``;
    ``sign-flip``: the update negated; ``stale``: the unchanged model it was sent (a free rider); ``nan``:
    NaN weights; ``lie-num-examples``: ``factor`` × its sample count (in its description too); ``crash``:
    an error; ``drop``: no reply. The clients' standalone reference runs without faults.
    """

    clients: dict[str, Any] = field(default_factory=dict)
    #: The multiplier of ``scale`` and ``lie-num-examples``.
    factor: float = 100.0
    #: The standard deviation of ``noise`` weights.
    noise_std: float = 1.0
    #: The first round the faults act in (the round-0 description lies from the start).
    from_round: int = 1


@dataclass
class GuardsConfig:
    """Server-side checks of each round's accepted updates, beyond the protocol checks (docs/reliability.md).

    A guarded update is rejected, logged and recorded in ``metrics.jsonl`` like a malformed one.
    """

    #: Reject an update whose norm ‖w_i − w_sent‖ exceeds this × the median over the round's updates
    #: (with 3 or more updates); None = off. 10 keeps honest non-IID clients and stops scaled or random ones.
    update_norm_factor: float | None = None
    #: Reject a reply whose num_examples exceeds this × the round's median num_examples; None = off.
    num_examples_factor: float | None = None
    #: Reject a reply (or description) claiming more samples than this; None = no bound.
    max_num_examples: int | None = None
    #: Undo a round whose aggregated global model is not finite (the round is logged and recorded).
    rollback_non_finite: bool = True
    #: Stop the run when every reply of this many consecutive rounds was rejected (0 = never).
    max_all_rejected_rounds: int = 3


@dataclass
class EngineConfig:
    """How the embedded engine runs the clients of a round (docs/performance.md)."""

    #: "sequential": one client after another; "vectorized": the round's clients at once with torch.func
    #: (trainers with FedAvg's, FedProx's or FedRS's training loop; SGD; no BatchNorm; submodel masks on
    #: ``mlp200`` only), refused with the reason otherwise;
    #: "auto": vectorized where it applies and the round has enough clients, else sequential (logged).
    mode: str = "sequential"


@dataclass
class MethodConfig:
    name: str = "fedavg"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExperimentConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    out: str | None = None
    name: str | None = None

    # -- conversion -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def copy(self, **overrides: Any) -> ExperimentConfig:
        cfg = from_dict(self.to_dict())
        for dotted, value in overrides.items():
            apply_override(cfg, dotted.replace("__", "."), value)
        return cfg

    def fingerprint(self, *sections: str, exclude: tuple[str, ...] = ()) -> str:
        """A short stable hash of the chosen sections (all if none), for caches and run names."""
        d = self.to_dict()
        chosen = {k: d[k] for k in (sections or d.keys())}
        for dotted in exclude:
            sec, _, key = dotted.partition(".")
            if sec in chosen and isinstance(chosen[sec], dict):
                chosen[sec] = {k: v for k, v in chosen[sec].items() if k != key}
        for dotted, default in LATER_KEYS.items():  # keys added later: absent while at their default
            sec, _, key = dotted.partition(".")
            if sec in chosen and chosen[sec].get(key, default) == default:
                chosen[sec] = {k: v for k, v in chosen[sec].items() if k != key}
        blob = json.dumps(chosen, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def run_fingerprint(self) -> str:
        """What makes two runs the same experiment: every key but the thread count and the output names.

        Checkpoints are resumed and finished runs reused only under an equal run fingerprint.
        """
        return self.fingerprint(
            *self.experiment_sections(), "seed", exclude=("train.threads", "eval.tensorboard")
        )

    def experiment_sections(self) -> tuple[str, ...]:
        """The sections that define the experiment: [faults] and [guards] only where they differ from their
        defaults, so that adding them kept every earlier run's fingerprint."""
        optional = tuple(s for s in OPTIONAL_SECTIONS if getattr(self, s) != SECTIONS[s]())
        return ("data", "model", "train", "method", "eval", *optional)


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "method": MethodConfig,
    "eval": EvalConfig,
    "faults": FaultsConfig,
    "guards": GuardsConfig,
    "engine": EngineConfig,
}
#: Sections written to TOML and fingerprinted only when they differ from their defaults.
OPTIONAL_SECTIONS = ("faults", "guards", "engine")
#: Keys added after fingerprints were in use, fingerprinted only when set, so earlier runs and caches keep
#: their keys (dotted key -> default).
LATER_KEYS: dict[str, Any] = {"data.path": None, "eval.tensorboard": False}
TOP_LEVEL = {"seed": int, "out": (str, type(None)), "name": (str, type(None))}

CHOICES: dict[tuple[str, str], tuple[Any, ...]] = {
    ("train", "optimizer"): ("sgd", "adam"),
    ("train", "schedule"): ("constant", "cosine", "exponential"),
    ("train", "device"): ("auto", "cpu", "cuda"),
    ("engine", "mode"): ("sequential", "vectorized", "auto"),
    ("eval", "fairness"): ("auto", True, False),
}


# --------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "")


def _coerce(section: str, name: str, value: Any, annotation: str) -> Any:
    """Check ``value`` against the field's annotation (given as a string), converting ints to floats."""
    where = f"{section}.{name}"
    ann = annotation.replace(" ", "")
    optional = "None" in ann
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where} must not be empty (None); expected {annotation}")
    base = ann.replace("|None", "").replace("None|", "")
    if base.startswith("dict"):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={value!r} must be a table/dict, e.g. {where}.alpha=0.1")
        return _table(where, value)
    if base == "float|int":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}={value!r} must be a number")
        if not math.isfinite(value):
            raise ConfigError(f"{where}={value!r} must be a finite number")
        return value
    if base == "str|bool":
        if not isinstance(value, str | bool):
            raise ConfigError(f"{where}={value!r} must be a string or boolean")
        return value
    if base == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}={value!r} must be true or false")
        return value
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}={value!r} must be an integer")
        return value
    if base == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}={value!r} must be a number")
        if not math.isfinite(value):
            raise ConfigError(f"{where}={value!r} must be a finite number")
        return float(value)
    if base == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}={value!r} must be a string")
        return value
    return value


def _table(where: str, table: dict[Any, Any]) -> dict[str, Any]:
    """A table value (e.g. method.params) as TOML can hold it: string keys; booleans, numbers, strings,
    lists and tables as values. An entry set to None is dropped: None means the method's default."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where} has the key {key!r}; keys must be strings")
        if value is None:
            continue
        out[key] = (
            _table(f"{where}.{key}", value) if isinstance(value, dict) else _plain(f"{where}.{key}", value)
        )
    return out


def _plain(where: str, value: Any) -> Any:
    if isinstance(value, dict):
        return _table(where, value)
    if isinstance(value, list | tuple):
        return [_plain(where, v) for v in value]
    if isinstance(value, bool | int | float | str):
        return value
    raise ConfigError(
        f"{where}={value!r} is a {type(value).__name__}; use a boolean, number, string, list or table"
    )


def _check_ranges(cfg: ExperimentConfig) -> None:
    """Range checks that the types alone do not express."""
    d, t, e = cfg.data, cfg.train, cfg.eval

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    for (sec, key), accepted in CHOICES.items():
        value = getattr(getattr(cfg, sec), key)
        need(value in accepted, f"{sec}.{key}={value!r} is not accepted; choose one of {list(accepted)}")
    need(d.clients >= 1, f"data.clients={d.clients} must be >= 1")
    need(
        0.0 <= d.validation_fraction < 1.0,
        f"data.validation_fraction={d.validation_fraction} must be in [0, 1)",
    )
    for key in ("max_train_samples", "max_test_samples"):
        v = getattr(d, key)
        need(v is None or v >= 1, f"data.{key}={v} must be >= 1 (or omitted for all samples)")
    need(t.rounds >= 1, f"train.rounds={t.rounds} must be >= 1")
    cpr = t.clients_per_round
    if isinstance(cpr, float):
        need(
            0.0 < cpr <= 1.0,
            f"train.clients_per_round={cpr}: a fraction must be in (0, 1]; use an int for a count",
        )
    else:
        need(cpr >= 1, f"train.clients_per_round={cpr} must be >= 1")
    need(
        t.local_epochs > 0 or (t.local_steps or 0) > 0,
        "train.local_epochs must be > 0 (or set train.local_steps)",
    )
    need(t.local_steps is None or t.local_steps >= 1, f"train.local_steps={t.local_steps} must be >= 1")
    need(t.batch_size >= 1, f"train.batch_size={t.batch_size} must be >= 1")
    need(t.lr > 0, f"train.lr={t.lr} must be > 0")
    need(t.lr_min >= 0, f"train.lr_min={t.lr_min} must be >= 0 (the cosine schedule's final learning rate)")
    need(
        0.0 < t.lr_decay <= 1.0,
        f"train.lr_decay={t.lr_decay} must be in (0, 1] (the exponential schedule's factor per round)",
    )
    if t.client_dropout > 0:
        per_round = (
            t.clients_per_round * d.clients if isinstance(t.clients_per_round, float) else t.clients_per_round
        )
        replying = (1.0 - t.client_dropout) * min(per_round, d.clients)
        need(
            replying >= 1.0 - 1e-9,  # (1 − 0.9)·10 is 0.9999999999999998
            f"train.client_dropout={t.client_dropout} with {min(per_round, d.clients):g} clients per round "
            f"leaves {replying:.2g} replying clients per round on average (fewer than one): most rounds "
            "would train nothing. Lower train.client_dropout or sample more clients",
        )
    need(0.0 <= t.momentum < 1.0, f"train.momentum={t.momentum} must be in [0, 1)")
    need(t.weight_decay >= 0, f"train.weight_decay={t.weight_decay} must be >= 0")
    need(t.grad_clip is None or t.grad_clip > 0, f"train.grad_clip={t.grad_clip} must be > 0 (or omitted)")
    need(0.0 <= t.client_dropout < 1.0, f"train.client_dropout={t.client_dropout} must be in [0, 1)")
    need(t.threads is None or t.threads >= 1, f"train.threads={t.threads} must be >= 1")
    need(e.every >= 1, f"eval.every={e.every} must be >= 1")
    need(e.batch_size >= 1, f"eval.batch_size={e.batch_size} must be >= 1")
    need(e.checkpoint_every >= 0, f"eval.checkpoint_every={e.checkpoint_every} must be >= 0")
    need(0.0 < e.bcf_alpha <= 1.0, f"eval.bcf_alpha={e.bcf_alpha} must be in (0, 1]")
    _check_faults(cfg)
    g = cfg.guards
    for key in ("update_norm_factor", "num_examples_factor"):
        v = getattr(g, key)
        need(v is None or v > 1.0, f"guards.{key}={v} must be > 1 (a multiple of the median), or omitted")
    need(
        g.max_num_examples is None or g.max_num_examples >= 1,
        f"guards.max_num_examples={g.max_num_examples} must be >= 1 (or omitted for no bound)",
    )
    need(
        g.max_all_rejected_rounds >= 0,
        f"guards.max_all_rejected_rounds={g.max_all_rejected_rounds} must be >= 0 (0 = never stop)",
    )


def _check_faults(cfg: ExperimentConfig) -> None:
    f, n = cfg.faults, cfg.data.clients
    for key, behaviour in list(f.clients.items()):
        if isinstance(behaviour, float) and math.isnan(behaviour):  # --set faults.clients.0=nan reads NaN
            f.clients[key] = behaviour = "nan"
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < n):
            raise ConfigError(
                f"faults.clients has key {key!r}; keys are client ids 0..{n - 1}, e.g. faults.clients.0=noise"
            )
        if behaviour not in FAULT_BEHAVIOURS:
            raise ConfigError(
                f"faults.clients.{key}={behaviour!r} is not a fault; choose one of {list(FAULT_BEHAVIOURS)}"
            )
    if not f.factor > 0:
        raise ConfigError(f"faults.factor={f.factor} must be > 0")
    if not f.noise_std > 0:
        raise ConfigError(f"faults.noise_std={f.noise_std} must be > 0")
    if f.from_round < 1:
        raise ConfigError(f"faults.from_round={f.from_round} must be >= 1")


def from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    """Build and validate a config from a nested dict (as read from TOML)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"a config must be a table, got {type(raw).__name__}")
    known = set(SECTIONS) | set(TOP_LEVEL)
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {sorted(unknown)}; accepted top-level keys: {sorted(known)}"
        )
    kwargs: dict[str, Any] = {}
    for sec, cls in SECTIONS.items():
        values = raw.get(sec, {})
        if not isinstance(values, dict):
            raise ConfigError(f"[{sec}] must be a table, got {values!r}")
        names = {f.name: f for f in fields(cls)}
        bad = set(values) - set(names)
        if bad:
            raise ConfigError(f"unknown key(s) {sorted(bad)} in [{sec}]; accepted: {sorted(names)}")
        sec_kwargs = {k: _coerce(sec, k, v, str(names[k].type)) for k, v in values.items()}
        kwargs[sec] = cls(**sec_kwargs)
    for key in TOP_LEVEL:
        if key in raw:
            value = raw[key]
            if key == "seed":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(f"seed={value!r} must be a non-negative integer")
            elif value is not None and not isinstance(value, str):
                raise ConfigError(f"{key}={value!r} must be a string")
            kwargs[key] = value
    cfg = ExperimentConfig(**kwargs)
    _check_ranges(cfg)
    return cfg


# --------------------------------------------------------------------------------------------------------
# Named experiments: the configs shipped with the package (``fedhet experiments``)
# --------------------------------------------------------------------------------------------------------
#: The shipped experiment files (package data; the repository's configs/ links here).
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def experiment_names() -> list[str]:
    """Names of the shipped experiments, e.g. ``celm/fmnist-maverick`` (the table specs of ``fedhet
    reproduce`` in configs/reproduce/ are not experiments)."""
    return sorted(
        p.relative_to(CONFIG_DIR).with_suffix("").as_posix()
        for p in CONFIG_DIR.glob("*/*.toml")
        if p.parent.name != "reproduce"
    )


def describe_experiment(name: str) -> str:
    """The first comment line of a shipped experiment file."""
    for line in (CONFIG_DIR / f"{name}.toml").read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def resolve_config(name_or_path: str | Path) -> Path:
    """An existing path as given; else a shipped experiment by name (``celm/fmnist-maverick``, with or
    without ``.toml`` or a leading ``configs/``); else the path as given (``load_config`` names the miss)."""
    p = Path(name_or_path)
    if p.exists():
        return p
    key = p.as_posix().removesuffix(".toml").removeprefix("configs/")
    if key in experiment_names():
        return CONFIG_DIR / f"{key}.toml"
    return p


def load_config(path: str | Path) -> ExperimentConfig:
    """Read a TOML experiment file, or a shipped experiment by name (:func:`experiment_names`)."""
    p = resolve_config(path)
    if p.is_dir():
        raise ConfigError(f"config file {p} is a directory; pass a .toml file (see `fedhet experiments`)")
    if not p.is_file():
        import difflib

        close = difflib.get_close_matches(str(path).removesuffix(".toml"), experiment_names(), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else "."
        raise ConfigError(
            f"config file {p} does not exist and is not a shipped experiment{hint} Pass an existing .toml "
            "file, or a name that `fedhet experiments` lists"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {p} is not UTF-8 text (byte {exc.start}: "
            f"{exc.object[exc.start : exc.start + 1]!r}); TOML files must be UTF-8: re-save it as UTF-8"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"config file {p} cannot be read: {exc.strerror}") from exc
    return load_config_text(text, source=str(p))


def load_config_text(text: str, source: str = "the config") -> ExperimentConfig:
    """Parse an experiment from TOML text (what ``to_toml`` writes; what a Flower server sends its nodes)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{source} nests values too deeply to be read") from exc
    return from_dict(raw)


# --------------------------------------------------------------------------------------------------------
# Overrides (``--set section.key=value``)
# --------------------------------------------------------------------------------------------------------
def parse_value(text: str) -> Any:
    """Parse a CLI value as a TOML literal (int, float, bool, list, string); bare words stay strings."""
    try:
        parsed = tomllib.loads(f"v = {text}")
        if set(parsed) != {"v"}:  # "0.5\nx = 1" is not one literal: never drop the rest silently
            return text
        return parsed["v"]
    except RecursionError as exc:
        raise ConfigError(f"the value {text[:20]!r}... nests too deeply to be read") from exc
    except tomllib.TOMLDecodeError:
        low = text.strip().lower()
        if low in ("none", "null"):
            return None
        return text


def apply_override(cfg: ExperimentConfig, dotted: str, value: Any) -> None:
    """Set ``section.key[.subkey]`` to ``value`` in place, validating the result."""
    if isinstance(value, str):
        value = parse_value(value)
    parts = dotted.split(".")
    if len(parts) == 1:
        if parts[0] not in TOP_LEVEL:
            raise ConfigError(
                f"unknown key {dotted!r}; use section.key with a section in {sorted(SECTIONS)} "
                f"or one of {sorted(TOP_LEVEL)}"
            )
        raw = cfg.to_dict()
        raw[parts[0]] = value
        new = from_dict(raw)
    else:
        sec, key, *rest = parts
        if sec not in SECTIONS:
            raise ConfigError(f"unknown section {sec!r} in {dotted!r}; accepted: {sorted(SECTIONS)}")
        raw = cfg.to_dict()
        if rest:
            table = raw[sec].get(key)
            if not isinstance(table, dict):
                raise ConfigError(f"{sec}.{key} is not a table; cannot set {dotted}")
            node = table
            for depth, part in enumerate(rest[:-1]):
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    inner = ".".join([sec, key, *rest[: depth + 1]])
                    raise ConfigError(f"{inner} is {node!r}, not a table; cannot set {dotted}")
            node[rest[-1]] = value
        else:
            if key not in raw[sec]:
                raise ConfigError(
                    f"unknown key {key!r} in [{sec}] (from {dotted!r}); accepted: {sorted(raw[sec])}"
                )
            raw[sec][key] = value
        new = from_dict(raw)
    for f in fields(ExperimentConfig):
        setattr(cfg, f.name, getattr(new, f.name))


def parse_set_args(items: list[str]) -> list[tuple[str, str]]:
    """Split ``key=value`` strings, with a clear error for malformed ones."""
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(
                f"--set {item!r} must look like section.key=value, e.g. data.split_params.alpha=0.05"
            )
        k, v = item.split("=", 1)
        out.append((k.strip(), v.strip()))
    return out


# --------------------------------------------------------------------------------------------------------
# TOML output
# --------------------------------------------------------------------------------------------------------
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise ConfigError(f"cannot write {v!r} ({type(v).__name__}) to TOML")


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes (not its surrogate pairs, invalid in TOML), and DEL (U+007F),
    which JSON leaves raw but TOML forbids unescaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_key(k: str) -> str:
    bare = k.isascii() and k.replace("_", "").replace("-", "").isalnum()  # TOML's bare keys: ASCII only
    return k if bare else _toml_string(k)


def to_toml(cfg: ExperimentConfig) -> str:
    """Serialise a config as TOML (None values are omitted: they are the defaults)."""
    d = cfg.to_dict()
    lines = []
    for key in TOP_LEVEL:
        if d[key] is not None:
            lines.append(f"{key} = {_toml_value(d[key])}")
    for sec in SECTIONS:
        if sec in OPTIONAL_SECTIONS and sec not in cfg.experiment_sections():
            continue
        lines.append(f"\n[{sec}]")
        for k, v in d[sec].items():
            if v is not None:
                lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"
