"""Typed experiment configuration: TOML in and out, every field validated.

Sections: ``[data]``, ``[model]``, ``[train]``, ``[method]``, ``[eval]``, the optional ``[faults]``
(injected client faults) and ``[guards]`` (server-side update checks), and the top-level ``seed``, ``out``,
``name``. Unknown keys are errors; every bad value raises :class:`~fedhet.errors.ConfigError` naming the
field, the value and what is accepted. Any key can be overridden with ``section.key=value``
(``--set`` on the command line), e.g. ``data.split_params.alpha=0.05``.

The section dataclasses are in ``config_sections.py`` and the checks of values in ``config_validation.py``;
every name of both that callers use is importable from here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedhet.config_sections import (
    CHANGED_METHOD_DEFAULTS,
    CHOICES,
    NEUTRAL_VALUE,
    WAS,
    AggregationConfig,
    DataConfig,
    EngineConfig,
    EvalConfig,
    FaultsConfig,
    GuardsConfig,
    MethodConfig,
    ModelConfig,
    TrainConfig,
    effective_lr,
    fingerprint_kind,
)
from fedhet.config_validation import check_ranges, coerce_value
from fedhet.errors import ConfigError

__all__ = [
    "CHOICES",
    "AggregationConfig",
    "CONFIG_DIR",
    "CHANGED_DEFAULTS",
    "OPTIONAL_SECTIONS",
    "SECTIONS",
    "TOP_LEVEL",
    "DataConfig",
    "EngineConfig",
    "EvalConfig",
    "ExperimentConfig",
    "FaultsConfig",
    "GuardsConfig",
    "MethodConfig",
    "ModelConfig",
    "TrainConfig",
    "apply_override",
    "apply_overrides",
    "describe_experiment",
    "experiment_names",
    "from_dict",
    "load_config",
    "load_run_config",
    "load_config_text",
    "parse_set_args",
    "parse_value",
    "resolve_config",
    "to_toml",
]


@dataclass
class ExperimentConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
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
        for sec in chosen:  # each field as it declares (config_sections: fingerprinted, neutral, ...)
            if sec in SECTIONS:
                chosen[sec] = {k: v for k, v in chosen[sec].items() if in_fingerprint(sec, k, v)}
        if isinstance(chosen.get("train"), dict) and "lr" in chosen["train"]:
            chosen["train"]["lr"] = self.learning_rate()
        if isinstance(chosen.get("method"), dict) and "params" in chosen["method"]:
            chosen["method"]["params"] = fingerprinted_params(self.method.name, self.method.params)
        blob = json.dumps(chosen, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def learning_rate(self) -> float:
        """The learning rate the run trains with (``train.lr``, else the model's default; config_sections)."""
        return effective_lr(self.model.name, self.train.lr)

    def run_fingerprint(self) -> str:
        """What makes two runs the same experiment: every key as its field declares (not the thread count,
        not the output names).

        Checkpoints are resumed and finished runs and records reused only under an equal run fingerprint.
        """
        return self.fingerprint(*self.experiment_sections(), "seed")

    def experiment_sections(self) -> tuple[str, ...]:
        """The sections that define the experiment: [faults], [guards] and [aggregation] only where they
        differ from their defaults, so that adding them kept every earlier run's fingerprint."""
        optional = tuple(s for s in OPTIONAL_SECTIONS if getattr(self, s) != section_before_changes(s))
        return ("data", "model", "train", "method", "eval", *optional)


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "method": MethodConfig,
    "eval": EvalConfig,
    "faults": FaultsConfig,
    "guards": GuardsConfig,
    "aggregation": AggregationConfig,
    "engine": EngineConfig,
}
#: Sections written to TOML and fingerprinted only when they differ from their defaults.
OPTIONAL_SECTIONS = ("faults", "guards", "aggregation", "engine")


def fingerprinted_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A method's params as its fingerprint holds them: each parameter of :data:`CHANGED_METHOD_DEFAULTS`
    at its value (the default now where ``params`` leave it out, written as declared, so that 1 and 1.0 are
    one experiment), and left out at its value before the change (what the earlier records ran with)."""
    out = dict(params)
    for key, (before, now) in CHANGED_METHOD_DEFAULTS.get(method, {}).items():
        value = out.get(key, now)
        if value == before:
            out.pop(key, None)
        else:
            out[key] = now if value == now else value
    return out


def in_fingerprint(section: str, key: str, value: Any) -> bool:
    """Whether ``section.key`` at ``value`` enters a fingerprint, as the field declares: always, never, or
    (a neutral key, added later) only when it differs from its neutral value."""
    f = _FIELDS[section][key]
    kind = fingerprint_kind(f)
    return kind == "always" or (kind == "when-set" and value != f.metadata[NEUTRAL_VALUE])


_FIELDS = {sec: {f.name: f for f in fields(cls)} for sec, cls in SECTIONS.items()}
#: Keys whose default changed after runs were recorded (dotted key -> the value before the change), from the
#: fields' ``was``. A run written before holds no such key and ran with this value: its own config.toml
#: reads it so (:func:`load_run_config`), and the optional sections are fingerprinted against these values,
#: so such a run keeps its fingerprint and resumes as it began, while a run at the new default is another
#: experiment.
CHANGED_DEFAULTS: dict[str, Any] = {
    f"{sec}.{name}": f.metadata[WAS]
    for sec, fs in _FIELDS.items()
    for name, f in fs.items()
    if WAS in f.metadata
}
TOP_LEVEL = {"seed": int, "out": (str, type(None)), "name": (str, type(None))}


def section_before_changes(section: str) -> Any:
    """The defaults of ``section`` with every :data:`CHANGED_DEFAULTS` value of it as it was before."""
    before = SECTIONS[section]()
    for dotted, value in CHANGED_DEFAULTS.items():
        sec, _, key = dotted.partition(".")
        if sec == section:
            setattr(before, key, value)
    return before


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
        sec_kwargs = {k: coerce_value(sec, k, v, str(names[k].type)) for k, v in values.items()}
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
    # a method parameter whose default changed reads as today's default where unset (load_run_config has
    # set a run file's value from before), so that a config and its TOML are the same dict
    for key, (_, now) in CHANGED_METHOD_DEFAULTS.get(cfg.method.name, {}).items():
        cfg.method.params.setdefault(key, now)
    check_ranges(cfg)
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


def load_run_config(path: str | Path) -> ExperimentConfig:
    """A run directory's own config.toml, read as the run ran: a key of :data:`CHANGED_DEFAULTS` it does not
    hold (written before the key existed) takes the value from before the change, not today's default."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    for dotted, value in CHANGED_DEFAULTS.items():
        sec, _, key = dotted.partition(".")
        section = raw.setdefault(sec, {})
        if isinstance(section, dict):
            section.setdefault(key, value)
    method = raw.get("method")
    if isinstance(method, dict):
        changed = CHANGED_METHOD_DEFAULTS.get(method.get("name", MethodConfig().name), {})
        params = method.setdefault("params", {})
        if isinstance(params, dict):
            for key, (before, _) in changed.items():
                params.setdefault(key, before)
    return from_dict(raw)


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
    apply_overrides(cfg, [(dotted, value)])


def apply_overrides(cfg: ExperimentConfig, overrides: Iterable[tuple[str, Any]]) -> None:
    """Set each ``section.key[.subkey]`` to its value in order (a later one wins), in place, and validate the
    result once: the config is built a single time however many flags and ``--set`` a command line has."""
    raw = cfg.to_dict()
    for dotted, value in overrides:
        _set_raw(raw, dotted, parse_value(value) if isinstance(value, str) else value)
    new = from_dict(raw)
    for f in fields(ExperimentConfig):
        setattr(cfg, f.name, getattr(new, f.name))


def _set_raw(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """``raw[section][key]...`` = ``value``, refusing unknown keys and sections (values are checked later)."""
    parts = dotted.split(".")
    if len(parts) == 1:
        if parts[0] not in TOP_LEVEL:
            raise ConfigError(
                f"unknown key {dotted!r}; use section.key with a section in {sorted(SECTIONS)} "
                f"or one of {sorted(TOP_LEVEL)}"
            )
        raw[parts[0]] = value
        return
    sec, key, *rest = parts
    if sec not in SECTIONS:
        raise ConfigError(f"unknown section {sec!r} in {dotted!r}; accepted: {sorted(SECTIONS)}")
    if not rest:
        if key not in raw[sec]:
            accepted = sorted(raw[sec])
            raise ConfigError(f"unknown key {key!r} in [{sec}] (from {dotted!r}); accepted: {accepted}")
        raw[sec][key] = value
        return
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
    # A method parameter whose default changed is written at its value, so that the file reads back as this
    # run anywhere (load_run_config reads a file without it as written before the change).
    changed = CHANGED_METHOD_DEFAULTS.get(cfg.method.name, {})
    d["method"]["params"] = {**{k: now for k, (_, now) in changed.items()}, **d["method"]["params"]}
    lines = []
    for key in TOP_LEVEL:
        if d[key] is not None:
            lines.append(f"{key} = {_toml_value(d[key])}")
    for sec in SECTIONS:
        # An optional section at today's defaults is left out. One at its defaults from before a change
        # (CHANGED_DEFAULTS) is written all the same, so that the file reads back as that config anywhere,
        # not as today's default; the fingerprint still matches the earlier runs' (experiment_sections).
        at_default = getattr(cfg, sec) == SECTIONS[sec]()
        if sec in OPTIONAL_SECTIONS and at_default and sec not in cfg.experiment_sections():
            continue
        lines.append(f"\n[{sec}]")
        for k, v in d[sec].items():
            if v is not None:
                lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"
